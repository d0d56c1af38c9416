//! Log timestamps to Unix epoch milliseconds (UTC), without a date library.
//!
//! Three spellings: nginx `$time_local` (`17/May/2015:10:05:03 +0000`), ISO
//! 8601 / RFC 3339 as in `$time_iso8601` (`2015-05-17T10:05:03+00:00`), and
//! epoch seconds with an optional fraction as in `$msec` (`1431857103.123`).
//! Each parser reads fixed positions digit by digit (`$time_local` keeps the
//! last text and value per thread, as consecutive lines share their second) and rejects anything out of range rather
//! than guessing: a bad time makes the line unparsed, never a wrong window.

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`). `month` is 1..=12 and `day` 1..=31; not validated here.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

thread_local! {
    /// The last `$time_local` parsed on this thread and its value: lines come
    /// in bursts within one second, and comparing 26 bytes costs a fraction
    /// of parsing them (callgrind: ~8% of `fleetban test`'s instructions).
    static LAST_TIME_LOCAL: std::cell::Cell<Option<([u8; 26], i64)>> = const { std::cell::Cell::new(None) };
}

/// nginx `$time_local`, exactly `DD/Mon/YYYY:HH:MM:SS ±HHMM` (26 bytes).
pub fn parse_time_local(s: &[u8]) -> Option<i64> {
    let s: &[u8; 26] = s.try_into().ok()?;
    if let Some((text, ms)) = LAST_TIME_LOCAL.get() {
        if text == *s {
            return Some(ms);
        }
    }
    let ms = parse_time_local_uncached(s)?;
    LAST_TIME_LOCAL.set(Some((*s, ms)));
    Some(ms)
}

fn parse_time_local_uncached(s: &[u8; 26]) -> Option<i64> {
    if s[2] != b'/' || s[6] != b'/' || s[11] != b':' || s[14] != b':' || s[17] != b':' {
        return None;
    }
    if s[20] != b' ' {
        return None;
    }
    let day = two(s[0], s[1])?;
    let month = month_number([s[3], s[4], s[5]])?;
    let year = four(&s[7..11])?;
    let hms = (two(s[12], s[13])?, two(s[15], s[16])?, two(s[18], s[19])?);
    let offset = offset_seconds(s[21], two(s[22], s[23])?, two(s[24], s[25])?)?;
    to_ms(year, month, day, hms, 0, offset)
}

/// ISO 8601 / RFC 3339 with a zone: `YYYY-MM-DDTHH:MM:SS[.fff][Z|±HH:MM|±HHMM]`.
/// A space may stand for the `T`. A time without a zone is rejected: its
/// meaning depends on the host that wrote it.
pub fn parse_iso8601(s: &[u8]) -> Option<i64> {
    if s.len() < 20 || s[4] != b'-' || s[7] != b'-' || s[13] != b':' || s[16] != b':' {
        return None;
    }
    if !matches!(s[10], b'T' | b't' | b' ') {
        return None;
    }
    let year = four(&s[0..4])?;
    let month = two(s[5], s[6])?;
    let day = two(s[8], s[9])?;
    let hms = (two(s[11], s[12])?, two(s[14], s[15])?, two(s[17], s[18])?);
    let mut rest = &s[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let digits = fraction.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        millis = fraction_millis(&fraction[..digits]);
        rest = &fraction[digits..];
    }
    let offset = match rest {
        [b'Z' | b'z'] => 0,
        [sign, h1, h2, b':', m1, m2] | [sign, h1, h2, m1, m2] => offset_seconds(*sign, two(*h1, *h2)?, two(*m1, *m2)?)?,
        _ => return None,
    };
    to_ms(year, month, day, hms, millis, offset)
}

/// Epoch seconds with an optional fraction, as `$msec` writes them
/// (`1431857103.123`). Digits beyond milliseconds are truncated.
pub fn parse_epoch(s: &[u8]) -> Option<i64> {
    let (whole, fraction) = match memchr::memchr(b'.', s) {
        Some(dot) => (&s[..dot], Some(&s[dot + 1..])),
        None => (s, None),
    };
    // 12 digits reach the year 33658: enough, and far from overflow.
    if whole.is_empty() || whole.len() > 12 || !whole.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let seconds = whole.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    let millis = match fraction {
        None => 0,
        Some(f) if !f.is_empty() && f.iter().all(u8::is_ascii_digit) => fraction_millis(f),
        Some(_) => return None,
    };
    Some(seconds * 1000 + millis)
}

/// nginx's error-log time, `YYYY/MM/DD HH:MM:SS` (19 bytes), which is the
/// server's local time with no zone: read in this host's local time zone
/// (`TZ`, else `/etc/localtime`) by libc's `mktime`, as nginx wrote it with
/// `localtime`. In the hour a clock is set back the local times repeat:
/// `mktime` picks one of the two instants (docs/design.md §5, `nginx_error`).
pub fn parse_error_log_time(s: &[u8]) -> Option<i64> {
    let s: &[u8; 19] = s.try_into().ok()?;
    if s[4] != b'/' || s[7] != b'/' || s[10] != b' ' || s[13] != b':' || s[16] != b':' {
        return None;
    }
    let year = four(&s[0..4])?;
    let (month, day) = (two(s[5], s[6])?, two(s[8], s[9])?);
    let hms = (two(s[11], s[12])?, two(s[14], s[15])?, two(s[17], s[18])?);
    // The civil time as if it were UTC, then the zone's offset at that hour.
    let civil = to_ms(year, month, day, hms, 0, 0)?;
    Some(civil - local_offset_s(civil.div_euclid(3_600_000))? * 1000)
}

/// The last (civil hour, offset) looked up, packed in one word: consecutive
/// lines share their hour, and `mktime` takes a lock and reads the zone.
/// Offsets change on the hour in every zone in use today (a few historical
/// ones changed at :30: their lines in that half hour read an hour off).
static LAST_OFFSET: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Seconds east of UTC of local time at `hour` (hours since 1970 in civil
/// time read as UTC).
fn local_offset_s(hour: i64) -> Option<i64> {
    use std::sync::atomic::Ordering::Relaxed;
    let key = u32::try_from(hour).ok().filter(|&h| h != u32::MAX);
    if let Some(key) = key {
        let last = LAST_OFFSET.load(Relaxed);
        if (last >> 32) as u32 == key {
            return Some(i64::from(last as u32 as i32));
        }
    }
    let (days, h) = (hour.div_euclid(24), hour.rem_euclid(24));
    let (y, m, d) = civil_from_days(days);
    // SAFETY: `tm` is a plain C struct, zeroed then filled; mktime reads and
    // normalises it and touches nothing else of ours.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = i32::try_from(y - 1900).ok()?;
    tm.tm_mon = m as i32 - 1;
    tm.tm_mday = d as i32;
    tm.tm_hour = h as i32;
    tm.tm_isdst = -1;
    let t = unsafe { libc::mktime(&mut tm) };
    if t == -1 && hour != -1 {
        return None;
    }
    let offset = hour * 3600 - t;
    if let (Some(key), Ok(o)) = (key, i32::try_from(offset)) {
        LAST_OFFSET.store(u64::from(key) << 32 | u64::from(o as u32), Relaxed);
    }
    Some(offset)
}

/// The civil date of a day count since 1970-01-01 (Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Any of the three spellings (for a regex's `time` group); `[...]` around a
/// `$time_local` is tolerated.
pub fn parse_time_any(s: &[u8]) -> Option<i64> {
    let s = match s {
        [b'[', inner @ .., b']'] => inner,
        _ => s,
    };
    match s.get(2) {
        Some(b'/') => parse_time_local(s),
        _ if s.get(4) == Some(&b'-') => parse_iso8601(s),
        _ => parse_epoch(s),
    }
}

fn to_ms(
    year: u32,
    month: u32,
    day: u32,
    (hour, minute, second): (u32, u32, u32),
    millis: i64,
    offset: i64,
) -> Option<i64> {
    // Second 60 is a leap second; it lands on the next minute's :00.
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(year), month, day);
    let seconds = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset;
    Some(seconds * 1000 + millis)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Seconds east of UTC for `±HH` `MM`; subtracting it from local time gives UTC.
fn offset_seconds(sign: u8, hours: u32, minutes: u32) -> Option<i64> {
    if hours > 23 || minutes > 59 {
        return None;
    }
    let seconds = i64::from(hours * 3600 + minutes * 60);
    match sign {
        b'+' => Some(seconds),
        b'-' => Some(-seconds),
        _ => None,
    }
}

fn month_number(name: [u8; 3]) -> Option<u32> {
    Some(match &name {
        b"Jan" => 1,
        b"Feb" => 2,
        b"Mar" => 3,
        b"Apr" => 4,
        b"May" => 5,
        b"Jun" => 6,
        b"Jul" => 7,
        b"Aug" => 8,
        b"Sep" => 9,
        b"Oct" => 10,
        b"Nov" => 11,
        b"Dec" => 12,
        _ => return None,
    })
}

/// Milliseconds from fraction digits (`5` is 500 ms, `123456` is 123 ms).
fn fraction_millis(digits: &[u8]) -> i64 {
    let mut millis = 0;
    for i in 0..3 {
        let d = digits.get(i).map_or(0, |d| i64::from(d - b'0'));
        millis = millis * 10 + d;
    }
    millis
}

#[inline]
fn two(a: u8, b: u8) -> Option<u32> {
    let (a, b) = (a.wrapping_sub(b'0'), b.wrapping_sub(b'0'));
    (a < 10 && b < 10).then(|| u32::from(a) * 10 + u32::from(b))
}

#[inline]
fn four(s: &[u8]) -> Option<u32> {
    match s {
        [a, b, c, d] => Some(two(*a, *b)? * 100 + two(*c, *d)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_from_days_inverts_days_from_civil() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn error_log_times_are_validated() {
        assert!(parse_error_log_time(b"2026/11/30 10:00:01").is_some());
        assert!(parse_error_log_time(b"2026/13/30 10:00:01").is_none());
        assert!(parse_error_log_time(b"2026/02/30 10:00:01").is_none());
        assert!(parse_error_log_time(b"2026-11-30 10:00:01").is_none());
        assert!(parse_error_log_time(b"2026/11/30 24:00:01").is_none());
        // One hour later is 3600 s later, whatever the zone (no transition then).
        let a = parse_error_log_time(b"2026/11/30 10:00:01").unwrap();
        let b = parse_error_log_time(b"2026/11/30 11:00:01").unwrap();
        assert_eq!(b - a, 3_600_000);
    }
}
