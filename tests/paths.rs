//! The path the rules see is the path nginx serves. Debian's nginx (default
//! configuration: `merge_slashes on`) serves `/.env` and `/.git/config` for
//! every spelling below, and answers the login spellings as its login
//! locations; the shipped `nginx-first-hit` bans each prober at its first
//! request, through the daemon tailing nginx's access log (nft in the web
//! namespace) and through `fleetban test` on the same log, and
//! `nginx-login` counts every login spelling. What nginx refuses (400) is
//! served to nobody and bans nobody.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cli, http_get_target, nft_bans, veth_pair, wait_until, ConfigDir, Daemon, NetNs, Nginx, Site};

const WEB: &str = "10.213.77.1";
const ENV: &str = "APP_KEY=not-a-real-secret\n";
const GIT_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n";

/// (client address, request target as sent, the file nginx serves).
const PROBES: [(&str, &str, &str); 8] = [
    ("10.213.77.11", "/%2eenv", ENV),
    ("10.213.77.12", "//.env", ENV),
    ("10.213.77.13", "/./.env", ENV),
    ("10.213.77.14", "/x/../.env", ENV),
    ("10.213.77.15", "/.e%6ev", ENV),
    ("10.213.77.16", "/.git/%63onfig", GIT_CONFIG),
    ("10.213.77.17", "/%2egit/config", GIT_CONFIG),
    ("10.213.77.18", "http://10.213.77.1:8080//%2Eenv?x=1", ENV),
];

/// One client guessing passwords through spellings of the login paths.
const LOGIN_CLIENT: &str = "10.213.77.30";
const LOGINS: [(&str, u16); 4] = [
    ("/wp-login%2ephp", 403),
    ("/wp-login.ph%70", 403),
    ("/logi%6e", 401),
    ("/wp-login.php?redirect_to=/", 403),
];

/// Pages: never a hit.
const VISITOR: &str = "10.213.77.40";

/// Targets nginx refuses (400: nothing served), from one client that is
/// therefore not banned: the rules see their raw path, which is not `/.env`.
const REFUSER: &str = "10.213.77.50";
const REFUSED: [&str; 4] = ["/.env%00", "/%2e%2e/.env", "/.env%zz", "/.en%"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped rule file `name`, reading `log`, written into `dir`.
fn shipped_rules(dir: &Path, name: &str, log: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join(format!("rules/{name}.yaml")))
        .unwrap()
        .replace("/var/log/nginx/access.log", log.to_str().unwrap());
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn nginx_serves_each_spelling_and_the_shipped_rules_ban_or_count_it() {
    let (web, client) = (NetNs::new("pweb"), NetNs::new("pcli"));
    let (_, client_if) = veth_pair(&web, WEB, &client, "10.213.77.2");
    for addr in PROBES.iter().map(|p| p.0).chain([LOGIN_CLIENT, VISITOR, REFUSER]) {
        client.run(&["ip", "addr", "add", &format!("{addr}/24"), "dev", &client_if]);
    }
    let site = Site {
        log_format: None,
        http: String::new(),
        server: "root {www};\n\
                 location = /wp-login.php { return 403; }\n\
                 location = /login { return 401; }\n"
            .into(),
    };
    let nginx = Nginx::start_site(&web, &format!("{WEB}:8080"), &site);
    let www = nginx.dir().join("www");
    std::fs::write(www.join(".env"), ENV).unwrap();
    std::fs::create_dir(www.join(".git")).unwrap();
    std::fs::write(www.join(".git/config"), GIT_CONFIG).unwrap();

    let files = ConfigDir::new();
    let rule_files: Vec<PathBuf> = ["nginx-first-hit", "nginx-login"]
        .iter()
        .map(|name| shipped_rules(files.path(), name, &nginx.access_log()))
        .collect();
    files.main_config().rule_files(&rule_files).write(&files.cfg);
    let daemon = Daemon::start(Some(&web), &files.cfg, &files.control);

    let url = nginx.url("/");
    let get = |from: &str, target: &str| http_get_target(&client, from, &url, target, Duration::from_secs(2));
    // A visitor's pages first: nothing to ban.
    assert_eq!(get(VISITOR, "/ok").map(|r| r.0), Ok(200));
    assert_eq!(get(VISITOR, "/env").map(|r| r.0), Ok(404));
    for (from, target, file) in PROBES {
        assert_eq!(get(from, target), Ok((200, file.to_owned())), "{target} from {from}");
    }
    for (target, status) in LOGINS {
        assert_eq!(get(LOGIN_CLIENT, target).map(|r| r.0), Ok(status), "{target}");
    }
    for target in REFUSED {
        assert_eq!(get(REFUSER, target).map(|r| r.0), Ok(400), "{target}");
    }
    let requests = 2 + PROBES.len() + LOGINS.len() + REFUSED.len();

    // The daemon: every prober in the kernel's set, by nginx-first-hit.
    wait_until(Duration::from_secs(15), "every prober dropped by nft", || {
        let set = nft_bans(&web, "fleetban", "v4");
        PROBES.iter().all(|(from, ..)| set.iter().any(|(e, _)| e == from))
    });
    daemon.wait_lines(requests as u64);
    let listed = cli(&files.cfg, &["bans", "--json"]);
    assert!(listed.success(), "{listed:?}");
    let bans: BTreeMap<String, String> = listed
        .stdout
        .lines()
        .map(|l| {
            let b: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            (
                b["addr"].as_str().unwrap().to_owned(),
                b["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: BTreeMap<String, String> = PROBES
        .iter()
        .map(|(from, ..)| (from.to_string(), "nginx-first-hit".to_owned()))
        .collect();
    assert_eq!(bans, want, "{}", daemon.log_text());
    // Its window for the login client holds every spelling.
    let explained = cli(&files.cfg, &["explain", "--json", LOGIN_CLIENT]);
    assert!(explained.success(), "{explained:?}");
    let e: serde_json::Value = serde_json::from_str(&explained.stdout).expect("JSON");
    let login = e["windows"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["rule"] == "nginx-login"))
        .unwrap_or_else(|| panic!("no nginx-login window: {e}"));
    assert_eq!(login["count"], LOGINS.len(), "{e}");

    // `fleetban test` on the log nginx wrote: the same bans, each at the
    // prober's line, and the login client's every request matched.
    let log = std::fs::read_to_string(nginx.access_log()).unwrap();
    assert_eq!(log.lines().count(), requests, "{log}");
    let out = cli(&files.cfg, &["test", "--json", nginx.access_log().to_str().unwrap()]);
    assert!(out.success(), "{out:?}");
    let mut replayed: Vec<(String, String, u64)> = out
        .test_bans()
        .iter()
        .map(|b| {
            (
                b["addr"].as_str().unwrap().to_owned(),
                b["rule"].as_str().unwrap().to_owned(),
                b["line"].as_u64().unwrap(),
            )
        })
        .collect();
    replayed.sort();
    let mut at_lines: Vec<(String, String, u64)> = PROBES
        .iter()
        .map(|(from, ..)| {
            let n = log.lines().position(|l| l.starts_with(&format!("{from} "))).unwrap();
            (from.to_string(), "nginx-first-hit".to_owned(), n as u64 + 1)
        })
        .collect();
    at_lines.sort();
    assert_eq!(replayed, at_lines, "{}\n{log}", out.stdout);
    let summary: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    let login = &summary["rules"]["nginx-login"];
    assert_eq!(login["matched"], LOGINS.len(), "{summary}");
    assert_eq!(login["closest"][0]["addr"], LOGIN_CLIENT, "{summary}");
    assert_eq!(login["closest"][0]["peak"], LOGINS.len(), "{summary}");
}
