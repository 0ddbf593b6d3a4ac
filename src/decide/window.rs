//! Reload windows: when a rollout may be written. A window opens at each time its cron schedule
//! fires (read in its IANA time zone) and stays open for its duration. With any `Allow` window a
//! rollout waits until one is open; an open `Deny` window holds it whatever the allow windows
//! say. A rollout already written is never interrupted: windows only gate writes.

use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::model::policy::{PolicyWindow, WindowType};
use crate::model::schedule::CronSchedule;

/// Windows one policy or workload may list.
pub const MAX_WINDOWS: usize = 16;
/// The longest a window stays open.
pub const MAX_WINDOW_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `reloader.rs/reload-windows` value read.
pub const MAX_WINDOWS_ANNOTATION: usize = 4096;

/// How far ahead the next opening is looked for: a schedule that fires less often (or never,
/// `0 0 30 2 *`) has no next window.
const HORIZON_DAYS: i32 = 5 * 366;

/// One window, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub allow: bool,
    pub schedule: CronSchedule,
    pub duration: Duration,
    pub zone: TimeZone,
}

/// What the windows say at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowGate {
    /// A rollout may be written now.
    Open,
    /// Not now: look again at `recheck`; `opens` is when an allow window opens next, if one
    /// does (the status shows it as `nextWindow`).
    Closed { recheck: Timestamp, opens: Option<Timestamp> },
}

/// Parses windows as a ReloadPolicy lists them; the error names the entry and what is wrong.
pub fn parse(entries: &[PolicyWindow]) -> Result<Vec<Window>, String> {
    if entries.len() > MAX_WINDOWS {
        return Err(format!("{} windows listed; at most {MAX_WINDOWS}", entries.len()));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let at = |why: String| format!("window {}: {why}", i + 1);
            let schedule = CronSchedule::parse(&e.schedule).map_err(|e| at(e.to_string()))?;
            let duration = crate::model::duration::parse_at_most(&e.duration, MAX_WINDOW_DURATION)
                .map_err(|e| at(e.to_string()))?;
            if duration.is_zero() {
                return Err(at("duration must be above 0".into()));
            }
            let name = e.time_zone.as_deref().unwrap_or("UTC");
            let zone = TimeZone::get(name).map_err(|_| {
                at(format!("unknown time zone {:?}", crate::model::limits::truncate(name, 64)))
            })?;
            Ok(Window { allow: e.type_ == WindowType::Allow, schedule, duration, zone })
        })
        .collect()
}

/// Parses the `reloader.rs/reload-windows` annotation: a JSON list of windows as a ReloadPolicy
/// writes them (`[{"type": "Allow", "schedule": "0 2 * * *", "duration": "2h",
/// "timeZone": "Europe/Berlin"}]`).
pub fn parse_annotation(value: &str) -> Result<Vec<Window>, String> {
    if value.len() > MAX_WINDOWS_ANNOTATION {
        return Err(format!("longer than {MAX_WINDOWS_ANNOTATION} bytes"));
    }
    let entries: Vec<PolicyWindow> = serde_json::from_str(value).map_err(|e| {
        format!("not a JSON list of windows (type, schedule, duration, timeZone): {e}")
    })?;
    parse(&entries)
}

/// The first time `schedule` fires in `zone` strictly after `after`, within the horizon.
pub fn next_firing(
    schedule: &CronSchedule,
    zone: &TimeZone,
    after: Timestamp,
) -> Option<Timestamp> {
    let start = after.to_zoned(zone.clone());
    let mut date = start.date();
    for _ in 0..HORIZON_DAYS {
        let weekday = date.weekday().to_sunday_zero_offset() as u32;
        if schedule.matches_day(date.month() as u32, date.day() as u32, weekday) {
            for hour in schedule.hours() {
                for minute in schedule.minutes() {
                    let civil = date.at(hour as i8, minute as i8, 0, 0);
                    // A time in a daylight-saving gap is moved forward by the gap (jiff's
                    // `compatible`, as RFC 5545 and Temporal do); in a fold, the first one.
                    let Ok(zoned) = zone.to_ambiguous_zoned(civil).compatible() else { continue };
                    if zoned.timestamp() > after {
                        return Some(zoned.timestamp());
                    }
                }
            }
        }
        date = date.tomorrow().ok()?;
    }
    None
}

/// When `window`, open at `now`, closes (at least until then: a later firing may extend it);
/// `None` when it is not open.
pub fn open_until(window: &Window, now: Timestamp) -> Option<Timestamp> {
    let length = jiff::SignedDuration::try_from(window.duration).ok()?;
    let since = now.checked_sub(length).ok()?;
    let fired = next_firing(&window.schedule, &window.zone, since)?;
    (fired <= now).then(|| fired.checked_add(length).ok()).flatten()
}

/// What `windows` say at `now`.
pub fn gate(windows: &[Window], now: Timestamp) -> WindowGate {
    let denied_until = windows.iter().filter(|w| !w.allow).filter_map(|w| open_until(w, now)).max();
    let allows: Vec<&Window> = windows.iter().filter(|w| w.allow).collect();
    let next_allow = || allows.iter().filter_map(|w| next_firing(&w.schedule, &w.zone, now)).min();
    if let Some(until) = denied_until {
        // Held by a deny window: look again when it closes.
        let opens =
            if allows.is_empty() { Some(until) } else { next_allow().map(|t| t.max(until)) };
        return WindowGate::Closed { recheck: until, opens };
    }
    if allows.is_empty() || allows.iter().any(|w| open_until(w, now).is_some()) {
        return WindowGate::Open;
    }
    let opens = next_allow();
    // A schedule that never fires again still gets looked at daily (a clock may be corrected).
    let recheck = opens.unwrap_or_else(|| now.checked_add(24.hours()).unwrap_or(now));
    WindowGate::Closed { recheck, opens }
}

/// Both gates at once: open when both are; otherwise looked at again at the earlier recheck,
/// and open at the later opening at the soonest.
pub fn both(a: WindowGate, b: WindowGate) -> WindowGate {
    match (a, b) {
        (WindowGate::Open, other) | (other, WindowGate::Open) => other,
        (
            WindowGate::Closed { recheck: r1, opens: o1 },
            WindowGate::Closed { recheck: r2, opens: o2 },
        ) => WindowGate::Closed {
            recheck: r1.min(r2),
            opens: match (o1, o2) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn window(allow: bool, schedule: &str, minutes: u64, zone: &str) -> Window {
        Window {
            allow,
            schedule: CronSchedule::parse(schedule).unwrap(),
            duration: Duration::from_secs(minutes * 60),
            zone: TimeZone::get(zone).unwrap(),
        }
    }

    #[test]
    fn windows_parse_from_the_policy_shape_and_errors_name_the_entry() {
        let w = parse_annotation(
            r#"[{"type":"Allow","schedule":"0 2 * * 1-5","duration":"2h","timeZone":"Europe/Berlin"},
                {"type":"Deny","schedule":"@daily","duration":"30m"}]"#,
        )
        .unwrap();
        assert_eq!(w.len(), 2);
        assert!(w[0].allow && !w[1].allow);
        assert_eq!(w[1].zone, TimeZone::UTC);
        assert_eq!(w[0].duration, Duration::from_secs(7200));
        for (value, says) in [
            (r#"[{"type":"Allow","schedule":"0 2 * *","duration":"2h"}]"#, "window 1: schedule"),
            (r#"[{"type":"Allow","schedule":"0 2 * * *","duration":"0s"}]"#, "above 0"),
            (
                r#"[{"type":"Allow","schedule":"0 2 * * *","duration":"169h"}]"#,
                "longer than the limit",
            ),
            (
                r#"[{"type":"Allow","schedule":"0 2 * * *","duration":"1h","timeZone":"Mars/Olympus"}]"#,
                "unknown time zone",
            ),
            (r#"{"type":"Allow"}"#, "not a JSON list"),
            (r#"[{"type":"Maybe","schedule":"0 2 * * *","duration":"1h"}]"#, "not a JSON list"),
        ] {
            let e = parse_annotation(value).unwrap_err();
            assert!(e.contains(says), "{value}: {e}");
        }
        let many = format!(
            "[{}]",
            vec![r#"{"type":"Deny","schedule":"@daily","duration":"1m"}"#; 17].join(",")
        );
        assert!(parse_annotation(&many).unwrap_err().contains("at most 16"));
        assert!(parse_annotation(&" ".repeat(5000)).unwrap_err().contains("longer than"));
    }

    #[test]
    fn next_firing_in_a_time_zone() {
        let s = CronSchedule::parse("30 2 * * *").unwrap();
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        // 02:30 in Berlin in winter is 01:30 UTC.
        assert_eq!(
            next_firing(&s, &berlin, at("2026-12-05T08:00:00Z")),
            Some(at("2026-12-06T01:30:00Z"))
        );
        // Strictly after: the firing itself is not its own next.
        assert_eq!(
            next_firing(&s, &berlin, at("2026-12-06T01:30:00Z")),
            Some(at("2026-12-07T01:30:00Z"))
        );
        // 02:30 does not exist on the spring-forward day: it is moved by the gap, to 03:30 local.
        assert_eq!(
            next_firing(&s, &berlin, at("2027-03-27T12:00:00Z")),
            Some(at("2027-03-28T01:30:00Z"))
        );
        // Never: February 30th.
        let never = CronSchedule::parse("0 0 30 2 *").unwrap();
        assert_eq!(next_firing(&never, &TimeZone::UTC, at("2026-12-05T08:00:00Z")), None);
    }

    #[test]
    fn allow_windows_open_for_their_duration() {
        let nightly = [window(true, "0 2 * * *", 120, "UTC")];
        assert_eq!(gate(&nightly, at("2026-12-05T02:00:00Z")), WindowGate::Open);
        assert_eq!(gate(&nightly, at("2026-12-05T03:59:59Z")), WindowGate::Open);
        assert_eq!(
            gate(&nightly, at("2026-12-05T04:00:00Z")),
            WindowGate::Closed {
                recheck: at("2026-12-06T02:00:00Z"),
                opens: Some(at("2026-12-06T02:00:00Z"))
            }
        );
        assert_eq!(gate(&[], at("2026-12-05T04:00:00Z")), WindowGate::Open, "no windows: always");
    }

    #[test]
    fn a_deny_window_inside_an_allow_window_holds() {
        let windows = [
            window(true, "0 8 * * *", 10 * 60, "UTC"), // 08:00-18:00
            window(false, "0 12 * * *", 60, "UTC"),    // but not 12:00-13:00
        ];
        assert_eq!(gate(&windows, at("2026-12-05T11:59:00Z")), WindowGate::Open);
        assert_eq!(
            gate(&windows, at("2026-12-05T12:30:00Z")),
            WindowGate::Closed {
                recheck: at("2026-12-05T13:00:00Z"),
                opens: Some(at("2026-12-06T08:00:00Z"))
            }
        );
        assert_eq!(gate(&windows, at("2026-12-05T13:00:00Z")), WindowGate::Open);
        // Deny windows alone: open except while one is.
        let deny = [window(false, "0 12 * * *", 60, "UTC")];
        assert_eq!(gate(&deny, at("2026-12-05T14:00:00Z")), WindowGate::Open);
        assert!(matches!(
            gate(&deny, at("2026-12-05T12:10:00Z")),
            WindowGate::Closed { opens: Some(t), .. } if t == at("2026-12-05T13:00:00Z")
        ));
    }

    #[test]
    fn a_window_that_never_opens_is_looked_at_daily() {
        let never = [window(true, "0 0 30 2 *", 60, "UTC")];
        assert_eq!(
            gate(&never, at("2026-12-05T00:00:00Z")),
            WindowGate::Closed { recheck: at("2026-12-06T00:00:00Z"), opens: None }
        );
    }
}
