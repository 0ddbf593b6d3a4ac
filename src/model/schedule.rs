//! Five-field cron schedules (minute, hour, day of month, month, day of week), read as Kubernetes
//! CronJobs and Vixie cron read them, for reload windows: `*`, lists, ranges, steps (`*/15`,
//! `1-5/2`, `10/5`), month and weekday names (`JAN`, `MON`), `7` for Sunday, and the macros
//! `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`. When both the
//! day of month and the day of week are restricted, a day matching either counts (cron's rule).
//!
//! Hand-written: the cron crates (cron, croner, saffron) compute with chrono and bring chrono-tz,
//! a second date-time library and time-zone database next to jiff, which the operator has through
//! k8s-openapi; the grammar is small, and every input a tenant writes is bounded here (its
//! length, each number's range, every step non-zero).

use std::fmt;

/// The longest schedule text read.
pub const MAX_SCHEDULE_LEN: usize = 128;

/// A parsed schedule: the set of values each field allows, as bit sets.
#[derive(Clone, PartialEq, Eq)]
pub struct CronSchedule {
    minutes: u64,
    hours: u32,
    days_of_month: u32,
    months: u16,
    days_of_week: u8,
    /// The field was not `*`: with both restricted, either one matching is enough.
    dom_restricted: bool,
    dow_restricted: bool,
}

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule is longer than {MAX_SCHEDULE_LEN} characters")]
    TooLong,
    #[error(
        "schedule {0:?} must have 5 fields (minute hour day-of-month month day-of-week) or be a macro such as @daily"
    )]
    Fields(String),
    #[error("{field} field {text:?}: {why}")]
    Field { field: &'static str, text: String, why: String },
}

struct FieldSpec {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: FieldSpec = FieldSpec { name: "minute", min: 0, max: 59, names: &[] };
const HOUR: FieldSpec = FieldSpec { name: "hour", min: 0, max: 23, names: &[] };
const DAY_OF_MONTH: FieldSpec = FieldSpec { name: "day-of-month", min: 1, max: 31, names: &[] };
const MONTH: FieldSpec = FieldSpec {
    name: "month",
    min: 1,
    max: 12,
    names: &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
};
// 7 is Sunday too; it is folded onto 0 after parsing.
const DAY_OF_WEEK: FieldSpec = FieldSpec {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

impl CronSchedule {
    pub fn parse(text: &str) -> Result<Self, ScheduleError> {
        if text.len() > MAX_SCHEDULE_LEN {
            return Err(ScheduleError::TooLong);
        }
        let expanded = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields[..] else {
            return Err(ScheduleError::Fields(text.to_string()));
        };
        let dow_bits = field(dow, &DAY_OF_WEEK)?;
        // Sunday is 0 and 7.
        let dow_bits = (dow_bits | (dow_bits >> 7)) & 0x7f;
        Ok(CronSchedule {
            minutes: field(minute, &MINUTE)?,
            hours: field(hour, &HOUR)? as u32,
            days_of_month: field(dom, &DAY_OF_MONTH)? as u32,
            months: field(month, &MONTH)? as u16,
            days_of_week: dow_bits as u8,
            dom_restricted: !dom.starts_with('*'),
            dow_restricted: !dow.starts_with('*'),
        })
    }

    /// Whether the schedule fires on this day (`month` 1–12, `day` 1–31, `weekday` 0–6 from
    /// Sunday).
    pub fn matches_day(&self, month: u32, day: u32, weekday: u32) -> bool {
        if self.months & (1 << month) == 0 {
            return false;
        }
        let dom = self.days_of_month & (1 << day) != 0;
        let dow = self.days_of_week & (1 << weekday) != 0;
        match (self.dom_restricted, self.dow_restricted) {
            (true, true) => dom || dow,
            _ => dom && dow,
        }
    }

    /// The hours it fires at, ascending.
    pub fn hours(&self) -> impl Iterator<Item = u32> + '_ {
        (0..24).filter(|h| self.hours & (1 << h) != 0)
    }

    /// The minutes it fires at, ascending.
    pub fn minutes(&self) -> impl Iterator<Item = u32> + '_ {
        (0..60).filter(|m| self.minutes & (1u64 << m) != 0)
    }
}

impl fmt::Debug for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronSchedule")
            .field("minutes", &self.minutes().collect::<Vec<_>>())
            .field("hours", &self.hours().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// One field as a bit set of the values it allows.
fn field(text: &str, spec: &FieldSpec) -> Result<u64, ScheduleError> {
    let err = |why: String| ScheduleError::Field { field: spec.name, text: text.to_string(), why };
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 =
                    s.parse().map_err(|_| err(format!("step {s:?} is not a number")))?;
                if step == 0 || step > spec.max {
                    return Err(err(format!("step {step} is out of range")));
                }
                (r, Some(step))
            }
            None => (item, None),
        };
        let (low, high) = if range == "*" {
            (spec.min, spec.max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, spec).map_err(err)?, value(b, spec).map_err(err)?)
        } else {
            let v = value(range, spec).map_err(err)?;
            // `10/5` runs from 10 to the end of the range.
            (v, if step.is_some() { spec.max } else { v })
        };
        if low > high {
            return Err(err(format!("range {low}-{high} runs backwards")));
        }
        let step = step.unwrap_or(1);
        let mut v = low;
        while v <= high {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

fn value(text: &str, spec: &FieldSpec) -> Result<u32, String> {
    let upper = text.to_ascii_uppercase();
    if let Some(i) = spec.names.iter().position(|n| *n == upper) {
        return Ok(i as u32 + if spec.min == 1 { 1 } else { 0 });
    }
    let v: u32 = text.parse().map_err(|_| format!("{text:?} is not a number or a name"))?;
    if v < spec.min || v > spec.max {
        return Err(format!("{v} is outside {}-{}", spec.min, spec.max));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_lists_ranges_steps_and_names() {
        let s = CronSchedule::parse("*/15 2-4,22 * JAN-MAR mon-fri").unwrap();
        assert_eq!(s.minutes().collect::<Vec<_>>(), [0, 15, 30, 45]);
        assert_eq!(s.hours().collect::<Vec<_>>(), [2, 3, 4, 22]);
        assert!(s.matches_day(2, 14, 1), "a Monday in February");
        assert!(!s.matches_day(2, 14, 0), "a Sunday");
        assert!(!s.matches_day(4, 14, 1), "April");
        let s = CronSchedule::parse("10/20 1-9/4 * * *").unwrap();
        assert_eq!(s.minutes().collect::<Vec<_>>(), [10, 30, 50]);
        assert_eq!(s.hours().collect::<Vec<_>>(), [1, 5, 9]);
    }

    #[test]
    fn sunday_is_0_and_7_and_restricted_days_match_either() {
        let s = CronSchedule::parse("0 0 * * 7").unwrap();
        assert!(s.matches_day(5, 3, 0));
        // The 1st or any Friday.
        let s = CronSchedule::parse("0 0 1 * 5").unwrap();
        assert!(s.matches_day(6, 1, 2));
        assert!(s.matches_day(6, 9, 5));
        assert!(!s.matches_day(6, 9, 4));
        // Only the day of month restricted: the weekday does not widen it.
        let s = CronSchedule::parse("0 0 1 * *").unwrap();
        assert!(!s.matches_day(6, 9, 5));
    }

    #[test]
    fn macros_expand() {
        assert_eq!(
            CronSchedule::parse("@daily").unwrap(),
            CronSchedule::parse("0 0 * * *").unwrap()
        );
        assert_eq!(CronSchedule::parse("@hourly").unwrap().minutes().collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (text, says) in [
            ("* * * *", "5 fields"),
            ("60 * * * *", "outside 0-59"),
            ("*/0 * * * *", "step 0"),
            ("5-1 * * * *", "backwards"),
            ("* * 0 * *", "outside 1-31"),
            ("* * * FOO *", "not a number or a name"),
            ("* * * * 8", "outside 0-7"),
            ("*/x * * * *", "not a number"),
        ] {
            let e = CronSchedule::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert_eq!(CronSchedule::parse(&"1 ".repeat(100)), Err(ScheduleError::TooLong));
    }
}
