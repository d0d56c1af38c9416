//! A deterministic nginx `combined` log generator for benchmarks and load
//! tests: ordinary clients (a share of them IPv6) browsing pages and static
//! files, plus scrapers fetching pages at a steady rate. The drivers in
//! `bench/` run it (`bench/exe.sh loggen` builds it and prints its path).
//!
//! cargo bench --bench loggen -- --lines 1000000 [--clients 50000]
//!     [--scrapers 20] [--per-second 2000] [--start-ms MS] [--ipv6 0.1] [--seed 1] > access.log
//!
//! `--lines` is required: `cargo test --bench '*'` and a bare `cargo bench`
//! run every bench target without arguments, and then it only says so.

use std::io::{BufWriter, Write};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const PAGES: [&str; 8] = [
    "/",
    "/products",
    "/products/42",
    "/blog/2026/11/redis",
    "/search?q=shoes",
    "/cart",
    "/about",
    "/contact",
];
const STATIC: [&str; 5] = [
    "/static/app.js",
    "/static/site.css",
    "/img/logo.png",
    "/favicon.ico",
    "/fonts/x.woff2",
];
const UAS: [&str; 4] = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_1) AppleWebKit/605.1.15 Version/18.1 Safari/605.1.15",
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--lines") {
        eprintln!("usage: loggen --lines N [--clients 50000] [--scrapers 20] [--per-second 2000] [--start-ms MS] [--ipv6 0.1] [--seed 1]");
        return;
    }
    let lines: u64 = arg(&args, "--lines", 1_000_000);
    let clients: u64 = arg(&args, "--clients", 50_000);
    let scrapers: u64 = arg(&args, "--scrapers", 20);
    let per_second: u64 = arg(&args, "--per-second", 2_000);
    let start_ms: i64 = arg(&args, "--start-ms", 1_767_225_600_000); // 2026-01-01
    let ipv6: f64 = arg(&args, "--ipv6", 0.1);
    let mut rng = Rng(arg::<u64>(&args, "--seed", 1).max(1));
    let out = std::io::stdout();
    let mut w = BufWriter::with_capacity(1 << 20, out.lock());
    let v6_clients = (clients as f64 * ipv6) as u64;
    let mut date_cache = (i64::MIN, String::new());
    for n in 0..lines {
        let ms = start_ms + (n * 1000 / per_second.max(1)) as i64;
        let secs = ms.div_euclid(1000);
        if secs != date_cache.0 {
            date_cache = (secs, fleetban::time_local(secs * 1000));
        }
        // One line in 20 from a scraper, the rest from ordinary clients.
        let (addr, path, ua) = if scrapers > 0 && rng.below(20) == 0 {
            let s = rng.below(scrapers);
            (
                format!("203.0.{}.{}", 113 + s / 250, 1 + s % 250),
                PAGES[rng.below(PAGES.len() as u64) as usize],
                "python-requests/2.32",
            )
        } else {
            let c = rng.below(clients);
            let addr = if c < v6_clients {
                format!("2001:db8:{:x}:{:x}::{:x}", c >> 16, c & 0xffff, 1 + rng.below(4))
            } else {
                format!("10.{}.{}.{}", (c >> 16) & 0xff, (c >> 8) & 0xff, c & 0xff)
            };
            let path = if rng.below(3) == 0 {
                PAGES[rng.below(8) as usize]
            } else {
                STATIC[rng.below(5) as usize]
            };
            (addr, path, UAS[rng.below(4) as usize])
        };
        let status = if rng.below(50) == 0 { 404 } else { 200 };
        let _ = writeln!(
            w,
            "{addr} - - [{}] \"GET {path} HTTP/1.1\" {status} {} \"https://shop.example/\" \"{ua}\"",
            date_cache.1,
            200 + rng.below(50_000)
        );
    }
}
