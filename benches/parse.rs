//! Parse throughput over the shared corpus (10,000 real `combined` lines):
//! one iteration parses every line, so the time per iteration divided by
//! 10,000 is the cost of one line. `cargo bench --bench parse`.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fleetban::parse::{Format, Parser};

const COMBINED: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent""#;
const REGEX: &str = r#"^(?P<addr>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<method>[A-Z]+) (?P<path>\S+)[^"]*" (?P<status>\d{3}) (?:\d+|-) "[^"]*" "(?P<ua>[^"]*)""#;

fn corpus() -> Vec<Vec<u8>> {
    let name = "shared/corpus/elastic-examples-access.log";
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(name);
    let path = if beside.exists() {
        beside
    } else {
        PathBuf::from("/work").join(name)
    };
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("corpus {}: {e}", path.display()));
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

fn parse(c: &mut Criterion) {
    let lines = corpus();
    let mut group = c.benchmark_group("parse");
    group.throughput(Throughput::Elements(lines.len() as u64));
    let formats = [
        ("combined", Format::Combined),
        ("common", Format::Common),
        ("log_format_combined", Format::LogFormat(COMBINED.to_string())),
        ("regex", Format::Regex(REGEX.to_string())),
    ];
    for (name, format) in formats {
        let parser = Parser::new(&format).expect("benchmark format");
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut parsed = 0u32;
                for line in &lines {
                    if let Some(request) = parser.parse(black_box(line)) {
                        parsed += u32::from(request.status != 0);
                        black_box(request);
                    }
                }
                parsed
            })
        });
    }
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
