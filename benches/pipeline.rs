//! Parse + match + decide, the `fleetban test` path, over the shared corpus
//! (10,000 real lines) with the shipped scraper rule and the memory store.
//! Whole-process figures (1M generated lines, `run` against Redis) come from
//! `bench/quick.sh`.

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fleetban::config::Config;
use fleetban::verdict::NeverBanned;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus/elastic-examples-access.log")
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fleetban.yaml");
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/nginx-scraper.yaml");
    std::fs::write(&cfg, format!("rules: ['{}']\n", rules.display())).unwrap();
    let config = Config::load(&cfg).expect("config");
    let log = corpus();
    let lines = std::fs::read(&log).unwrap().iter().filter(|&&b| b == b'\n').count() as u64;
    let allow = NeverBanned::only(&[]);
    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Elements(lines));
    let inputs = fleetban::replay::of_args(&config.rules, &[log]).unwrap().files;
    let options = fleetban::replay::Options::default();
    g.bench_function("corpus_scraper_rule", |b| {
        b.iter(|| {
            fleetban::replay::replay(&config.rules, &inputs, &allow, &config.proxies, 64, &options, |_| {}).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
