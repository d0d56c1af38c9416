//! Scenarios for `source`: following log files through appends, partial lines,
//! every rotation style, restarts, long lines and backpressure, plus a property
//! test of the line splitter and a 200,000-line stress run with rotations.
//!
//! Every scenario runs the real follower on temp dirs with short intervals and
//! acts as the consumer: it commits `chunk.end()` after each chunk, as the
//! daemon does. Waits are bounded loops; nothing sleeps for a fixed time to
//! "make sure" except the checks that nothing more arrives.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetban::source::{self, Chunk, FileId, FollowOptions, Follower, LineSplitter, OffsetStore};
use proptest::prelude::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const TIMEOUT: Duration = Duration::from_secs(20);

fn opts() -> FollowOptions {
    FollowOptions {
        poll_interval: Duration::from_millis(10),
        read_chunk: 64 << 10,
        max_line: 1024,
        drain_quiet: Duration::from_millis(300),
        rescan_interval: Duration::from_millis(50),
        inotify: true,
        framed: Vec::new(),
    }
}

/// A line as the consumer saw it.
#[derive(Debug)]
struct Line {
    source: usize,
    path: PathBuf,
    offset: u64,
    text: String,
}

/// A running follower plus the consumer's side of it.
struct Rig {
    store: Arc<OffsetStore>,
    rx: mpsc::Receiver<Chunk>,
    follower: Follower,
    shutdown: CancellationToken,
    /// Lines received but not yet handed to the test.
    queue: VecDeque<Line>,
    skipped_long: u64,
}

impl Rig {
    fn start<P: AsRef<Path>>(state: &Path, patterns: &[P], opts: FollowOptions, capacity: usize) -> Rig {
        let store = Arc::new(OffsetStore::open(state).expect("open offsets"));
        let (tx, rx) = mpsc::channel(capacity);
        let shutdown = CancellationToken::new();
        let patterns = patterns.iter().map(|p| p.as_ref().display().to_string()).collect();
        let follower = source::spawn(patterns, Arc::clone(&store), opts, tx, shutdown.clone());
        Rig {
            store,
            rx,
            follower,
            shutdown,
            queue: VecDeque::new(),
            skipped_long: 0,
        }
    }

    /// Receives one chunk (or times out), queues its lines, commits it.
    async fn pump(&mut self, timeout: Duration) -> bool {
        let Ok(Some(chunk)) = tokio::time::timeout(timeout, self.rx.recv()).await else {
            return false;
        };
        assert!(chunk.data.is_empty() || chunk.data.ends_with(b"\n"));
        for (offset, line) in chunk.lines() {
            self.queue.push_back(Line {
                source: chunk.source,
                path: chunk.path.to_path_buf(),
                offset,
                text: String::from_utf8_lossy(line).into_owned(),
            });
        }
        self.skipped_long += chunk.skipped_long;
        self.store.commit(&chunk.path, chunk.file, chunk.end());
        true
    }

    async fn recv(&mut self, n: usize) -> Vec<Line> {
        let deadline = Instant::now() + TIMEOUT;
        while self.queue.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                self.pump(left).await,
                "timed out: got {} of {n} lines: {:?}",
                self.queue.len(),
                self.queue
            );
        }
        self.queue.drain(..n).collect()
    }

    /// Nothing more arrives for `d`.
    async fn quiet(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while self.pump(deadline.saturating_duration_since(Instant::now())).await {}
        assert!(self.queue.is_empty(), "unexpected lines: {:?}", self.queue);
    }

    /// Until the follower reads the file now at `path`.
    async fn wait_following(&self, path: &Path) {
        let ino = fs::metadata(path).expect("stat").ino();
        wait_until("follower to open the file", || {
            self.follower
                .stats()
                .iter()
                .any(|s| s.path == path && s.file.is_some_and(|f| f.ino == ino))
        })
        .await;
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.follower.join().await;
        self.store.save().expect("save offsets");
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open for append");
    f.write_all(text.as_bytes()).expect("append");
}

fn open_append(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open for append")
}

/// An empty `access.log` in a temp dir, the offsets in another, and a
/// follower with the default options that has opened the log.
async fn follow_empty_log() -> (tempfile::TempDir, tempfile::TempDir, PathBuf, Rig) {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    File::create(&log).unwrap();
    let rig = Rig::start(state.path(), &[&log], opts(), 16);
    rig.wait_following(&log).await;
    (logs, state, log, rig)
}

fn numbered(from: usize, to: usize) -> String {
    (from..to).map(|i| format!("line {i:06} of the log\n")).collect()
}

/// The sequence number `numbered` wrote into a line.
fn seq(line: &Line) -> usize {
    line.text[5..11].parse().expect("seq")
}

fn seqs(lines: &[Line]) -> Vec<usize> {
    lines.iter().map(seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_seen_file_starts_at_its_end_and_appends_arrive_once() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    fs::write(&log, "old 1\nold 2\npart").unwrap();
    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    rig.wait_following(&log).await;

    append(&log, "ial\nnew 1\r\nnew 2\n");
    let got = rig.recv(3).await;
    let texts: Vec<_> = got.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(texts, ["partial", "new 1", "new 2"]);
    let offsets: Vec<_> = got.iter().map(|l| l.offset).collect();
    assert_eq!(offsets, [12, 20, 27]);
    assert!(got.iter().all(|l| l.path == log && l.source == 0));
    rig.quiet(Duration::from_millis(150)).await;
    let (id, offset) = rig.store.get(&log).expect("committed");
    assert_eq!((id, offset), (FileId::of_path(&log).unwrap(), 33));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_line_waits_for_its_newline() {
    let (_logs, _state, log, mut rig) = follow_empty_log().await;

    append(&log, "hal");
    rig.quiet(Duration::from_millis(150)).await;
    append(&log, "f a line");
    rig.quiet(Duration::from_millis(100)).await;
    append(&log, "\nnext\n");
    let got = rig.recv(2).await;
    assert_eq!((got[0].offset, got[0].text.as_str()), (0, "half a line"));
    assert_eq!((got[1].offset, got[1].text.as_str()), (12, "next"));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_and_create_while_writing_loses_and_repeats_nothing() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    let rotated = logs.path().join("access.log.1");
    File::create(&log).unwrap();
    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    rig.wait_following(&log).await;

    // Like nginx between logrotate's rename and its reopen: the old handle
    // keeps being written while the new file fills up.
    let (log2, rotated2) = (log.clone(), rotated.clone());
    let writer = std::thread::spawn(move || {
        let mut old = open_append(&log2);
        for i in 0..2000 {
            old.write_all(numbered(i, i + 1).as_bytes()).unwrap();
            if i % 200 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        fs::rename(&log2, &rotated2).unwrap();
        old.write_all(numbered(2000, 2500).as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut new = open_append(&log2);
        for i in 2500..5000 {
            let to = if i < 3500 && i % 2 == 1 { &mut old } else { &mut new };
            to.write_all(numbered(i, i + 1).as_bytes()).unwrap();
            if i % 200 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let got = rig.recv(5000).await;
    writer.join().unwrap();
    let mut seen = seqs(&got);
    seen.sort_unstable();
    assert_eq!(seen, (0..5000).collect::<Vec<_>>());
    let first_new = got.iter().find(|l| l.text.starts_with("line 002500")).unwrap();
    assert_eq!(first_new.offset, 0, "the new file is read from 0");
    rig.quiet(Duration::from_millis(200)).await;
    wait_until("old file to be closed", || {
        rig.follower.stats().iter().all(|s| s.draining == 0)
    })
    .await;
    assert_eq!(rig.store.get(&log).unwrap().0, FileId::of_path(&log).unwrap());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copytruncate_restarts_at_zero() {
    let (logs, _state, log, mut rig) = follow_empty_log().await;
    let mut writer = open_append(&log);

    // Shrinks: seen by size.
    writer.write_all(numbered(0, 100).as_bytes()).unwrap();
    assert_eq!(seqs(&rig.recv(100).await), (0..100).collect::<Vec<_>>());
    fs::copy(&log, logs.path().join("access.log.1")).unwrap();
    OpenOptions::new().write(true).open(&log).unwrap().set_len(0).unwrap();
    writer.write_all(numbered(100, 110).as_bytes()).unwrap();
    let got = rig.recv(10).await;
    assert_eq!(seqs(&got), (100..110).collect::<Vec<_>>());
    assert_eq!(got[0].offset, 0);

    // Grows past the old size at once: seen by the fingerprint.
    OpenOptions::new().write(true).open(&log).unwrap().set_len(0).unwrap();
    writer.write_all(numbered(110, 400).as_bytes()).unwrap();
    let got = rig.recv(290).await;
    assert_eq!(seqs(&got), (110..400).collect::<Vec<_>>());
    assert_eq!(got[0].offset, 0);
    rig.quiet(Duration::from_millis(150)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_recreate_drains_the_old_and_reads_the_new_from_zero() {
    let (_logs, _state, log, mut rig) = follow_empty_log().await;

    let mut old = open_append(&log);
    old.write_all(numbered(0, 50).as_bytes()).unwrap();
    fs::remove_file(&log).unwrap();
    old.write_all(numbered(50, 60).as_bytes()).unwrap(); // to the unlinked file
    append(&log, &numbered(60, 80));
    let got = rig.recv(80).await;
    let mut seen = seqs(&got);
    seen.sort_unstable();
    assert_eq!(seen, (0..80).collect::<Vec<_>>());
    let first_new = got.iter().find(|l| l.text.starts_with("line 000060")).unwrap();
    assert_eq!(first_new.offset, 0);
    rig.quiet(Duration::from_millis(150)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn globs_and_missing_paths_pick_up_files_created_later() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let present = logs.path().join("a.log");
    fs::write(&present, "before start\n").unwrap();
    let glob = logs.path().join("*.log");
    let missing = logs.path().join("later.txt");
    let mut rig = Rig::start(state.path(), &[&glob, &missing], opts(), 16);
    rig.wait_following(&present).await;

    append(&present, "a 1\n");
    let got = rig.recv(1).await;
    assert_eq!((got[0].source, got[0].offset, got[0].text.as_str()), (0, 13, "a 1"));

    let created = logs.path().join("b.log");
    fs::write(&created, "b 1\nb 2\n").unwrap();
    fs::write(logs.path().join("ignored.txt"), "not matched\n").unwrap();
    let got = rig.recv(2).await;
    assert_eq!(
        (got[0].path.as_path(), got[0].offset, got[0].text.as_str()),
        (created.as_path(), 0, "b 1")
    );

    fs::write(&missing, "late 1\n").unwrap();
    let got = rig.recv(1).await;
    assert_eq!((got[0].source, got[0].offset, got[0].text.as_str()), (1, 0, "late 1"));

    // Deleted and back: a new file, from 0.
    fs::remove_file(&created).unwrap();
    rig.quiet(Duration::from_millis(150)).await;
    fs::write(&created, "b again\n").unwrap();
    let got = rig.recv(1).await;
    assert_eq!((got[0].offset, got[0].text.as_str()), (0, "b again"));
    rig.quiet(Duration::from_millis(100)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_exactly_and_drains_a_file_rotated_meanwhile() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    fs::write(&log, "history\n").unwrap();

    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    rig.wait_following(&log).await;
    append(&log, &numbered(0, 10));
    assert_eq!(seqs(&rig.recv(10).await), (0..10).collect::<Vec<_>>());
    append(&log, "partial");
    rig.quiet(Duration::from_millis(100)).await;
    rig.stop().await;
    assert!(state.path().join("offsets.json").exists());

    // While down: the partial line ends, more lines come.
    append(&log, "ly\n");
    append(&log, &numbered(10, 15));
    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    let got = rig.recv(6).await;
    assert_eq!((got[0].offset, got[0].text.as_str()), (8 + 10 * 23, "partially"));
    assert_eq!(seqs(&got[1..]), (10..15).collect::<Vec<_>>());
    rig.quiet(Duration::from_millis(150)).await;
    rig.stop().await;

    // While down: rotated by rename+create.
    fs::rename(&log, logs.path().join("access.log.1")).unwrap();
    append(&logs.path().join("access.log.1"), "late write to the old file\n");
    append(&log, &numbered(15, 18));
    // The old file is found beside the path and drained from where we were.
    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    let mut got = rig.recv(4).await;
    let late = got.iter().position(|l| l.text.starts_with("late")).expect("late line");
    let late = got.remove(late);
    assert_eq!((late.path.as_path(), late.offset), (log.as_path(), 8 + 10 + 15 * 23));
    assert_eq!(seqs(&got), [15, 16, 17]);
    assert_eq!(got[0].offset, 0);
    rig.quiet(Duration::from_millis(150)).await;
    rig.stop().await;
    // Drained and closed: forgotten, never read again.
    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    rig.quiet(Duration::from_millis(400)).await;
    rig.stop().await;
    let saved = fs::read_to_string(state.path().join("offsets.json")).unwrap();
    assert!(!saved.contains("rotated"), "{saved}");
}

/// A copytruncate the follower did not see (it was held up by a full
/// channel, as by a slow consumer) followed by a rename: the renamed file
/// holds only lines written after the truncation. Its rotated entry must
/// name the file as it is now (offset 0, its new first bytes), so that a
/// restart before it is drained finds it beside the path and reads it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncation_seen_only_at_the_rename_survives_a_restart() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    let other = logs.path().join("other.log");
    File::create(&log).unwrap();
    File::create(&other).unwrap();
    let opts = FollowOptions {
        read_chunk: 4096,
        ..opts()
    };
    let mut rig = Rig::start(state.path(), &[&log, &other], opts.clone(), 1);
    rig.wait_following(&log).await;
    let mut writer = open_append(&log);
    writer.write_all(numbered(0, 100).as_bytes()).unwrap();
    assert_eq!(seqs(&rig.recv(100).await), (0..100).collect::<Vec<_>>());

    // The other file fills the channel: the follower waits to send and
    // only looks for new files at the paths (no reads, no truncation check).
    append(&other, &numbered(1000, 2000));
    wait_until("the channel to fill", || rig.rx.len() == 1).await;
    fs::copy(&log, logs.path().join("access.log.1")).unwrap();
    OpenOptions::new().write(true).open(&log).unwrap().set_len(0).unwrap();
    writer.write_all(numbered(100, 150).as_bytes()).unwrap();
    fs::rename(&log, logs.path().join("access.log.2")).unwrap();
    append(&log, &numbered(150, 153));
    let new = FileId::of_path(&log).unwrap();
    wait_until("the follower to open the new file", || {
        rig.store.get(&log).is_some_and(|(id, _)| id.ino == new.ino)
    })
    .await;
    // Stopped before anything of the renamed file was read.
    rig.stop().await;

    let mut rig = Rig::start(state.path(), &[&log, &other], opts, 16);
    let got = rig.recv(1000 + 53).await;
    let mut ours: Vec<&Line> = got.iter().filter(|l| l.path == log).collect();
    ours.sort_by_key(|l| seq(l));
    let seen: Vec<usize> = ours.iter().map(|l| seq(l)).collect();
    assert_eq!(
        seen,
        (100..153).collect::<Vec<_>>(),
        "each line after the truncation once"
    );
    assert_eq!(ours[0].offset, 0, "the renamed file from its start");
    rig.quiet(Duration::from_millis(400)).await;
    rig.stop().await;
}

/// While the follower is down the log is copytruncated, written to, and
/// renamed (logrotate's `copytruncate` then a `create` rotation): the
/// renamed file is the one it was reading, with other first bytes. It was
/// there before the offsets were last saved, so it is that file, rewritten
/// in place: what it holds now is drained from its start, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copytruncate_then_a_rename_while_down_is_drained_from_its_start() {
    let (logs, state, log, mut rig) = follow_empty_log().await;
    let mut writer = open_append(&log);
    writer.write_all(numbered(0, 100).as_bytes()).unwrap();
    assert_eq!(seqs(&rig.recv(100).await), (0..100).collect::<Vec<_>>());
    rig.stop().await;

    fs::copy(&log, logs.path().join("access.log.1")).unwrap();
    OpenOptions::new().write(true).open(&log).unwrap().set_len(0).unwrap();
    writer.write_all(numbered(100, 150).as_bytes()).unwrap();
    fs::rename(&log, logs.path().join("access.log.2")).unwrap();
    append(&log, &numbered(150, 153));

    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    let mut got = rig.recv(53).await;
    got.sort_by_key(seq);
    assert_eq!(seqs(&got), (100..153).collect::<Vec<_>>());
    assert_eq!((got[0].offset, got[50].offset), (0, 0), "both files from their start");
    rig.quiet(Duration::from_millis(400)).await;
    rig.stop().await;
    let saved = fs::read_to_string(state.path().join("offsets.json")).unwrap();
    assert!(!saved.contains("rotated"), "drained and forgotten: {saved}");
}

/// A rotated entry whose inode now holds other first bytes is read only if
/// that file was created before the offsets were saved (the inode could not
/// have been reused then); a file created later on a reused inode is
/// another file, never read as ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_entry_reads_its_inode_with_other_bytes_only_if_it_was_there_at_the_save() {
    for (saved_after_creation, want) in [(false, vec![]), (true, (500..520).collect::<Vec<_>>())] {
        let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let log = logs.path().join("access.log");
        File::create(&log).unwrap();
        let other = logs.path().join("access.log.1");
        fs::write(&other, numbered(500, 520)).unwrap(); // past the fingerprint's 256 bytes
        let m = fs::metadata(&other).unwrap();
        let offsets = state.path().join("offsets.json");
        fs::write(
            &offsets,
            format!(
                r#"{{"version": 1, "files": {{}}, "rotated": [{{"path": "{}", "dev": {}, "ino": {}, "fingerprint": 12345, "offset": 40}}]}}"#,
                log.display(),
                m.dev(),
                m.ino()
            ),
        )
        .unwrap();
        let born = m.created().unwrap();
        let saved = if saved_after_creation {
            born + Duration::from_secs(1)
        } else {
            born - Duration::from_secs(60)
        };
        File::options()
            .write(true)
            .open(&offsets)
            .unwrap()
            .set_modified(saved)
            .unwrap();

        let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
        let got = rig.recv(want.len()).await;
        assert_eq!(
            seqs(&got),
            want,
            "saved after the file's creation: {saved_after_creation}"
        );
        if let Some(first) = got.first() {
            assert_eq!(first.offset, 0);
        }
        rig.quiet(Duration::from_millis(400)).await;
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_first_seen_then_idle_loses_nothing_written_while_down() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    fs::write(&log, "history\n").unwrap();
    let rig = Rig::start(state.path(), &[&log], opts(), 16);
    rig.wait_following(&log).await;
    rig.stop().await; // nothing was read, nothing committed

    append(&log, &numbered(0, 3));
    let mut rig = Rig::start(state.path(), &[&log], opts(), 16);
    let got = rig.recv(3).await;
    assert_eq!((got[0].offset, seqs(&got)), (8, vec![0, 1, 2]));
    rig.quiet(Duration::from_millis(100)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lines_are_skipped_and_counted_and_the_next_line_is_intact() {
    let (_logs, _state, log, mut rig) = follow_empty_log().await;

    append(&log, &format!("short\n{}\nafter\n", "x".repeat(5000)));
    let got = rig.recv(2).await;
    assert_eq!((got[0].offset, got[0].text.as_str()), (0, "short"));
    assert_eq!((got[1].offset, got[1].text.as_str()), (6 + 5001, "after"));

    // A long line that arrives in pieces, across polls.
    for _ in 0..3 {
        append(&log, &"y".repeat(700));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    append(&log, "\nok\n");
    let got = rig.recv(1).await;
    assert_eq!((got[0].offset, got[0].text.as_str()), (6 + 5001 + 6 + 2101, "ok"));
    rig.quiet(Duration::from_millis(100)).await;
    assert_eq!(rig.skipped_long, 2);
    let size = fs::metadata(&log).unwrap().len();
    assert_eq!(rig.store.get(&log).unwrap().1, size, "checkpoint covers skipped lines");
    assert_eq!(rig.follower.stats()[0].skipped_long, 2);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_channel_pauses_reading_without_losing_lines() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    File::create(&log).unwrap();
    let opts = FollowOptions {
        read_chunk: 4096,
        ..opts()
    };
    let bound = 3 * (opts.read_chunk + opts.max_line) as u64;
    let mut rig = Rig::start(state.path(), &[&log], opts, 1);
    rig.wait_following(&log).await;

    let n = 40_000;
    append(&log, &numbered(0, n));
    let total = fs::metadata(&log).unwrap().len();
    assert!(total > 20 * bound);
    let (mut consumed, mut lines, mut max_ahead) = (0u64, 0usize, 0u64);
    let deadline = Instant::now() + TIMEOUT;
    while lines < n {
        let chunk = tokio::time::timeout_at(deadline.into(), rig.rx.recv())
            .await
            .expect("timed out")
            .unwrap();
        consumed += chunk.end() - chunk.start;
        lines += chunk.lines().count();
        let read = rig.follower.stats()[0].bytes;
        max_ahead = max_ahead.max(read.saturating_sub(consumed));
        tokio::time::sleep(Duration::from_millis(1)).await; // a slow consumer
    }
    assert_eq!((lines, consumed), (n, total));
    assert!(
        max_ahead <= bound,
        "read {max_ahead} bytes ahead of the consumer (bound {bound})"
    );
    rig.quiet(Duration::from_millis(100)).await;
    rig.stop().await;
}

#[test]
fn offsets_survive_a_reopen_and_a_corrupt_file_is_set_aside() {
    let state = tempfile::tempdir().unwrap();
    let (log, id) = (
        Path::new("/var/log/nginx/access.log"),
        FileId {
            dev: 1,
            ino: 2,
            fingerprint: 3,
        },
    );
    let store = OffsetStore::open(state.path()).unwrap();
    store.commit(log, id, 42);
    store.save().unwrap();
    let names: Vec<_> = fs::read_dir(state.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["offsets.json"], "no temp file left behind");
    assert_eq!(OffsetStore::open(state.path()).unwrap().get(log), Some((id, 42)));

    fs::write(state.path().join("offsets.json"), "{not json").unwrap();
    let store = OffsetStore::open(state.path()).unwrap();
    assert_eq!(store.get(log), None);
    assert!(state.path().join("offsets.json.corrupt").exists());
}

/// Splits `input` the obvious way: (offset, line without \n and \r) for lines
/// up to `max_line`, the number of longer ones, and the end of the last line.
fn reference_split(input: &[u8], max_line: usize) -> (Vec<(u64, Vec<u8>)>, u64, u64) {
    let (mut lines, mut skipped, mut pos) = (Vec::new(), 0, 0);
    while let Some(n) = input[pos..].iter().position(|&b| b == b'\n') {
        let line = &input[pos..pos + n];
        if n > max_line {
            skipped += 1;
        } else {
            lines.push((pos as u64, line.strip_suffix(b"\r").unwrap_or(line).to_vec()));
        }
        pos += n + 1;
    }
    (lines, skipped, pos as u64)
}

proptest! {
    #[test]
    fn splitting_in_random_pieces_gives_the_same_lines(
        input in proptest::collection::vec(prop::sample::select(b"ab\r\n\n".to_vec()), 0..300),
        cuts in proptest::collection::vec((0usize..40, any::<bool>()), 0..40),
        max_line in 0usize..12,
    ) {
        let base = 1000;
        let path: Arc<Path> = Path::new("/x").into();
        let id = FileId { dev: 1, ino: 2, fingerprint: 3 };
        let mut split = LineSplitter::new(max_line, base);
        let mut chunks = Vec::new();
        let mut rest = &input[..];
        for (len, take) in cuts {
            let (piece, tail) = rest.split_at(len.min(rest.len()));
            split.push(piece);
            rest = tail;
            if take {
                split.take(0, &path, id, &mut chunks);
            }
        }
        split.push(rest);
        split.take(0, &path, id, &mut chunks);

        let (want, want_skipped, want_end) = reference_split(&input, max_line);
        let got: Vec<(u64, Vec<u8>)> = chunks.iter()
            .flat_map(|c| c.lines().map(|(o, l)| (o - base, l.to_vec())))
            .collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(chunks.iter().map(|c| c.skipped_long).sum::<u64>(), want_skipped);
        prop_assert_eq!(split.position(), base + want_end);
        let mut at = base;
        for c in &chunks {
            prop_assert_eq!(c.start, at);
            prop_assert!(c.data.is_empty() || c.data.ends_with(b"\n"));
            prop_assert_eq!(c.lines as usize, c.lines().count());
            at = c.end();
        }
        prop_assert_eq!(at, base + want_end);
    }
}

proptest! {
    /// Random bytes (NUL, invalid UTF-8, `\r`, lines longer than the limit,
    /// no newline at all), split in random pieces, then a real line: the
    /// splitter never panics, and the line after the garbage comes out whole
    /// and parses exactly as it does alone.
    #[test]
    fn garbage_never_costs_the_next_good_line(
        garbage in proptest::collection::vec(any::<u8>(), 0..3000),
        newlines in proptest::collection::vec(0usize..3000, 0..8),
        cuts in proptest::collection::vec(1usize..700, 1..20),
        n in 0u32..1_000_000,
    ) {
        let parser = fleetban::parse::Parser::new(&fleetban::parse::Format::Combined).unwrap();
        let good = format!(
            "203.0.{}.{} - - [17/May/2015:10:05:{:02} +0000] \"GET /p/{n} HTTP/1.1\" 200 12 \"-\" \"ua\"",
            n % 250, n / 250 % 250, n % 60
        );
        let mut input = garbage;
        for i in newlines {
            if let Some(b) = input.get_mut(i) {
                *b = b'\n';
            }
        }
        input.push(b'\n'); // the garbage ends as a line of its own (maybe too long)
        input.extend_from_slice(good.as_bytes());
        input.push(b'\n');
        let path: Arc<Path> = Path::new("/x").into();
        let id = FileId { dev: 1, ino: 2, fingerprint: 3 };
        let mut split = LineSplitter::new(1024, 0);
        let mut chunks = Vec::new();
        let mut rest = &input[..];
        for len in cuts.iter().cycle().take(10_000) {
            if rest.is_empty() {
                break;
            }
            let (piece, tail) = rest.split_at((*len).min(rest.len()));
            split.push(piece);
            split.take(0, &path, id, &mut chunks);
            rest = tail;
        }
        let lines: Vec<&[u8]> = chunks.iter().flat_map(|c| c.lines().map(|(_, l)| l)).collect();
        for l in &lines {
            let _ = parser.parse(l);
        }
        prop_assert_eq!(lines.last().copied(), Some(good.as_bytes()));
        let req = parser.parse(good.as_bytes());
        prop_assert!(req.is_some());
        prop_assert_eq!(parser.parse(lines[lines.len() - 1]), req);
        prop_assert_eq!(split.position(), input.len() as u64);
    }
}

#[derive(Clone, Copy, Debug)]
enum Rotation {
    /// logrotate's default; the old handle is written a little longer.
    RenameCreate,
    /// logrotate `copytruncate`.
    CopyTruncate,
    /// The log is deleted and created again; the old handle writes a bit more.
    DeleteRecreate,
    /// Rename and reopen at once.
    RenameReopen,
}

/// 200,000 numbered lines, rotated every 20,000 in turn by each style: every
/// line arrives exactly once. With inotify wake-ups (and polling)...
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_200k_lines_through_mixed_rotations_arrive_exactly_once() {
    stress(opts()).await;
}

/// ...and by polling alone (NFS, inotify limits exhausted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_by_polling_only() {
    stress(FollowOptions {
        inotify: false,
        ..opts()
    })
    .await;
}

/// inotify wakes the follower: with a poll interval longer than the test's
/// timeout, appends, a rename+create and a new file still arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inotify_wakes_the_follower_without_waiting_for_the_poll() {
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    File::create(&log).unwrap();
    let slow = FollowOptions {
        poll_interval: Duration::from_secs(3600),
        rescan_interval: Duration::from_secs(3600),
        ..opts()
    };
    let mut rig = Rig::start(state.path(), &[&log], slow, 16);
    assert!(rig.follower.is_watching());
    rig.wait_following(&log).await;
    append(&log, &numbered(0, 3));
    assert_eq!(seqs(&rig.recv(3).await), [0, 1, 2]);
    fs::rename(&log, logs.path().join("access.log.1")).unwrap();
    append(&logs.path().join("access.log.1"), &numbered(3, 4));
    append(&log, &numbered(4, 6));
    let mut got = seqs(&rig.recv(3).await);
    got.sort();
    assert_eq!(got, [3, 4, 5]);
    rig.stop().await;
}

async fn stress(opts: FollowOptions) {
    const N: usize = 200_000;
    const PER_FILE: usize = 20_000;
    let (logs, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = logs.path().join("access.log");
    let rotated = logs.path().join("access.log.1");
    File::create(&log).unwrap();
    let rig = Rig::start(state.path(), &[&log], opts, 64);
    rig.wait_following(&log).await;
    let Rig {
        store,
        mut rx,
        follower,
        shutdown,
        ..
    } = rig;

    let received = Arc::new(AtomicU64::new(0));
    let consumer = {
        let received = Arc::clone(&received);
        tokio::spawn(async move {
            let mut counts = vec![0u32; N];
            while let Some(chunk) = rx.recv().await {
                for (_, line) in chunk.lines() {
                    let seq: usize = std::str::from_utf8(&line[5..11]).unwrap().parse().unwrap();
                    counts[seq] += 1;
                }
                received.fetch_add(chunk.lines, Ordering::Relaxed);
                store.commit(&chunk.path, chunk.file, chunk.end());
            }
            counts
        })
    };
    let styles = [
        Rotation::RenameCreate,
        Rotation::CopyTruncate,
        Rotation::DeleteRecreate,
        Rotation::RenameReopen,
    ];
    let mut w = open_append(&log);
    let mut seq = 0;
    fn write(to: &mut File, seq: &mut usize, n: usize) {
        to.write_all(numbered(*seq, *seq + n).as_bytes()).unwrap();
        *seq += n;
    }
    for round in 0..N / PER_FILE {
        // Each rotation below writes 300 lines: the round's first.
        let mut left = if round == 0 { PER_FILE } else { PER_FILE - 300 };
        while left > 0 {
            let n = left.min(1000);
            write(&mut w, &mut seq, n);
            left -= n;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if round + 1 == N / PER_FILE {
            break;
        }
        // Rotating a file the follower never saw would lose it: in real life
        // a log lives far longer than a poll interval.
        let ino = fs::metadata(&log).unwrap().ino();
        wait_until("follower to open the file", || {
            follower.stats().iter().any(|s| s.file.is_some_and(|f| f.ino == ino))
        })
        .await;
        match styles[round % styles.len()] {
            Rotation::RenameCreate => {
                fs::rename(&log, &rotated).unwrap();
                write(&mut w, &mut seq, 100);
                let mut new = open_append(&log);
                write(&mut new, &mut seq, 100);
                write(&mut w, &mut seq, 100);
                w = new;
            }
            Rotation::CopyTruncate => {
                // Lines written between the copy and the truncation are lost
                // by copytruncate itself; rotate when the reader has caught up.
                let sent = seq as u64;
                let deadline = Instant::now() + TIMEOUT;
                while received.load(Ordering::Relaxed) != sent {
                    if Instant::now() > deadline {
                        shutdown.cancel();
                        let counts = consumer.await.unwrap();
                        let missing: Vec<_> = (0..seq)
                            .filter(|&i| counts[i] != 1)
                            .take(20)
                            .map(|i| (i, counts[i]))
                            .collect();
                        panic!(
                            "round {round}: got {} of {sent}; wrong: {missing:?}",
                            received.load(Ordering::Relaxed)
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                fs::copy(&log, &rotated).unwrap();
                OpenOptions::new().write(true).open(&log).unwrap().set_len(0).unwrap();
                write(&mut w, &mut seq, 300);
            }
            Rotation::DeleteRecreate => {
                fs::remove_file(&log).unwrap();
                write(&mut w, &mut seq, 200);
                w = open_append(&log);
                write(&mut w, &mut seq, 100);
            }
            Rotation::RenameReopen => {
                fs::rename(&log, &rotated).unwrap();
                w = open_append(&log);
                write(&mut w, &mut seq, 300);
            }
        }
    }
    assert_eq!(seq, N);
    wait_until("every line", || received.load(Ordering::Relaxed) >= N as u64).await;
    tokio::time::sleep(Duration::from_millis(400)).await; // old files drained and closed
    shutdown.cancel();
    follower.join().await;
    let counts = consumer.await.unwrap();
    let missing: Vec<_> = (0..N).filter(|&i| counts[i] == 0).take(10).collect();
    let repeated: Vec<_> = (0..N).filter(|&i| counts[i] > 1).take(10).collect();
    assert!(
        missing.is_empty() && repeated.is_empty(),
        "missing {missing:?}, repeated {repeated:?}"
    );
}

proptest! {
    /// Reading into the splitter's own memory (`lend` + `push_buf`, what
    /// `fleetban test` does) gives what pushing copies gives.
    #[test]
    fn reading_into_lent_buffers_gives_the_same_lines(
        input in proptest::collection::vec(prop::sample::select(b"ab\r\n\n".to_vec()), 0..300),
        cuts in proptest::collection::vec(0usize..40, 0..40),
        max_line in 0usize..12,
    ) {
        let path: Arc<Path> = Path::new("/x").into();
        let id = FileId { dev: 1, ino: 2, fingerprint: 3 };
        let mut split = LineSplitter::new(max_line, 0);
        let (mut chunks, mut buf) = (Vec::new(), Vec::new());
        let mut rest = &input[..];
        for len in cuts.into_iter().chain([usize::MAX]) {
            let (piece, tail) = rest.split_at(len.min(rest.len()));
            split.lend(&mut buf);
            buf.extend_from_slice(piece);
            split.push_buf(&mut buf);
            rest = tail;
            split.take(0, &path, id, &mut chunks);
        }
        let (want, want_skipped, want_end) = reference_split(&input, max_line);
        let got: Vec<(u64, Vec<u8>)> = chunks.iter().flat_map(|c| c.lines().map(|(o, l)| (o, l.to_vec()))).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(chunks.iter().map(|c| c.skipped_long).sum::<u64>(), want_skipped);
        prop_assert_eq!(split.position(), want_end);
        let mut at = 0;
        for c in &chunks {
            prop_assert_eq!(c.start, at);
            prop_assert_eq!(c.lines as usize, c.lines().count());
            at = c.end();
        }
    }
}
