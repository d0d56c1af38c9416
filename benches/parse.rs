//! Parse throughput over the sample corpus (tests/data/corpus) (10,000 real `combined` lines):
//! one iteration parses every line, so the time per iteration divided by
//! 10,000 is the cost of one line. `cargo bench --bench parse`. The `json`
//! and `nginx_error` cases read the same requests rewritten as nginx writes
//! them with `escape=json` and in its error log.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fleetban::parse::{Format, Parser};

const COMBINED: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent""#;
const REGEX: &str = r#"^(?P<addr>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<method>[A-Z]+) (?P<path>\S+)[^"]*" (?P<status>\d{3}) (?:\d+|-) "[^"]*" "(?P<ua>[^"]*)""#;

fn corpus() -> Vec<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus/elastic-examples-access.log");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("corpus {}: {e}", path.display()));
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// A JSON string as nginx's `escape=json` writes it.
fn json_string(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'"');
    for &b in value {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// RFC 3339 UTC of epoch ms (the corpus years only).
fn iso(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (mut days, s) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let mut y = 1970;
    while days >= fleetban::parse::days_from_civil(y + 1, 1, 1) - fleetban::parse::days_from_civil(y, 1, 1) {
        days -= fleetban::parse::days_from_civil(y + 1, 1, 1) - fleetban::parse::days_from_civil(y, 1, 1);
        y += 1;
    }
    let start = fleetban::parse::days_from_civil(y, 1, 1);
    let m = (1..=12u32)
        .rev()
        .find(|&m| fleetban::parse::days_from_civil(y, m, 1) - start <= days)
        .unwrap_or(1);
    let d = days - (fleetban::parse::days_from_civil(y, m, 1) - start) + 1;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+00:00",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// The corpus's requests as `escape=json` objects and as error-log lines.
fn rewritten(lines: &[Vec<u8>]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let combined = Parser::new(&Format::Combined).unwrap();
    let (mut json, mut errors) = (Vec::new(), Vec::new());
    for line in lines {
        let Some(r) = combined.parse(line) else { continue };
        let t = r.time_ms.unwrap_or(0);
        let request = [r.method, b" ", r.path, b" HTTP/1.1"].concat();
        let mut o = Vec::with_capacity(line.len() + 128);
        o.extend_from_slice(b"{\"time_iso8601\":");
        json_string(&mut o, iso(t).as_bytes());
        for (key, value) in [
            ("remote_addr", r.addr.to_string().into_bytes()),
            ("request", request.clone()),
            ("status", r.status.to_string().into_bytes()),
            ("body_bytes_sent", b"512".to_vec()),
            ("http_referer", r.referer.to_vec()),
            ("http_user_agent", r.user_agent.to_vec()),
        ] {
            o.extend_from_slice(format!(",\"{key}\":").as_bytes());
            json_string(&mut o, &value);
        }
        o.push(b'}');
        json.push(o);
        let date = iso(t).replace('-', "/").replace('T', " ");
        errors.push(
            format!(
                "{} [error] 1234#0: *5 limiting requests, excess: 0.500 by zone \"one\", client: {}, server: example.com, request: \"{}\", host: \"example.com\"",
                &date[..19],
                r.addr,
                String::from_utf8_lossy(&request)
            )
            .into_bytes(),
        );
    }
    (json, errors)
}

fn parse(c: &mut Criterion) {
    let lines = corpus();
    let (json, errors) = rewritten(&lines);
    let mut group = c.benchmark_group("parse");
    group.throughput(Throughput::Elements(lines.len() as u64));
    let formats = [
        ("combined", Format::Combined, &lines),
        ("common", Format::Common, &lines),
        ("log_format_combined", Format::LogFormat(COMBINED.to_string()), &lines),
        ("regex", Format::Regex(REGEX.to_string()), &lines),
        ("json", Format::Json(fleetban::parse::default_json_mapping()), &json),
        ("nginx_error", Format::NginxError, &errors),
    ];
    for (name, format, lines) in formats {
        let parser = Parser::new(&format).expect("benchmark format");
        let parsed = lines.iter().filter(|l| parser.parse(l).is_some()).count();
        assert!(
            parsed * 10 >= lines.len() * 9,
            "{name}: only {parsed} of {} lines parse",
            lines.len()
        );
        let mut scratch = Vec::new();
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut parsed = 0u32;
                for line in lines {
                    if let Some(request) = parser.parse_in(black_box(line), &mut scratch) {
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

/// Reading a file to its end in chunks (`fleetban test`'s reader): the
/// corpus and its error-log rewriting as they are, and the error log framed
/// (lines held until the records around them are known, split ones marked).
fn read(c: &mut Criterion) {
    let lines = corpus();
    let (_, errors) = rewritten(&lines);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Elements(lines.len() as u64));
    let framer: fleetban::source::Framer = fleetban::parse::split_records;
    for (name, lines, framed) in [
        ("access", &lines, None),
        ("error", &errors, None),
        ("error_framed", &errors, Some(framer)),
    ] {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            lines
                .iter()
                .flat_map(|l| l.iter().chain(b"\n"))
                .copied()
                .collect::<Vec<u8>>(),
        )
        .expect("write the log");
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut n = 0u64;
                fleetban::source::read_file(&path, framed, |chunk, _| n += chunk.lines).expect("read");
                n
            })
        });
    }
    group.finish();
}

criterion_group!(benches, parse, read);
criterion_main!(benches);
