//! Standard 5-field cron schedules (`minute hour day-of-month month day-of-week`, UTC), as in
//! crontab(5): `*`, numbers, ranges `a-b`, lists `a,b`, steps `*/n` and `a-b/n`, month and day
//! names (`jan`, `mon`), Sunday as 0 or 7, and day-of-month OR day-of-week when both are
//! restricted. No seconds field: CNPG's six fields surprise users (its docs warn about it).

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Timelike, Utc};
use std::str::FromStr;

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    day_of_month_restricted: bool,
    day_of_week_restricted: bool,
}

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseScheduleError {
    /// Not five fields.
    #[error("schedule {0:?} must have 5 fields: minute hour day-of-month month day-of-week")]
    FieldCount(String),
    /// One field is malformed or out of range.
    #[error("schedule field {field} {value:?}: {reason}")]
    Field {
        /// Which field.
        field: &'static str,
        /// Its text.
        value: String,
        /// Why.
        reason: String,
    },
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

struct FieldSpec {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

fn value(spec: &FieldSpec, text: &str) -> Result<u32, String> {
    if let Some(index) = spec.names.iter().position(|name| name.eq_ignore_ascii_case(text)) {
        return Ok(spec.min + index as u32);
    }
    let number: u32 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
    if number < spec.min || number > spec.max {
        return Err(format!("{number} is outside {}-{}", spec.min, spec.max));
    }
    Ok(number)
}

/// The bit set of a field, and whether it was `*` (unrestricted).
fn parse_field(spec: &FieldSpec, text: &str) -> Result<(u64, bool), ParseScheduleError> {
    let error = |reason: String| ParseScheduleError::Field { field: spec.name, value: text.to_string(), reason };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().map_err(|_| error(format!("step {step:?} is not a number")))?;
                if step == 0 {
                    return Err(error("a step must be at least 1".to_string()));
                }
                (range, step)
            }
            None => (part, 1),
        };
        let (first, last) = match range {
            "*" => (spec.min, spec.max),
            _ => match range.split_once('-') {
                Some((first, last)) => (value(spec, first).map_err(error)?, value(spec, last).map_err(error)?),
                // `5/15` means from 5 to the end, every 15 (as cronie does).
                None if part.contains('/') => (value(spec, range).map_err(error)?, spec.max),
                None => {
                    let single = value(spec, range).map_err(error)?;
                    (single, single)
                }
            },
        };
        if first > last {
            return Err(error(format!("range {first}-{last} is backwards")));
        }
        for number in (first..=last).step_by(step as usize) {
            bits |= 1 << number;
        }
    }
    // crontab(5): a field starting with `*` does not restrict (matters for day-of-month/week).
    Ok((bits, text.starts_with('*')))
}

impl FromStr for Schedule {
    type Err = ParseScheduleError;

    fn from_str(text: &str) -> Result<Schedule, ParseScheduleError> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [minute, hour, day_of_month, month, day_of_week] = fields.as_slice() else {
            return Err(ParseScheduleError::FieldCount(text.to_string()));
        };
        let field = |name, min, max, names: &'static [&'static str], text: &str| {
            parse_field(&FieldSpec { name, min, max, names }, text)
        };
        let (minutes, _) = field("minute", 0, 59, &[], minute)?;
        let (hours, _) = field("hour", 0, 23, &[], hour)?;
        let (days_of_month, any_day_of_month) = field("day-of-month", 1, 31, &[], day_of_month)?;
        let (months, _) = field("month", 1, 12, &MONTHS, month)?;
        let (mut days_of_week, any_day_of_week) = field("day-of-week", 0, 7, &DAYS, day_of_week)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week |= 1; // 7 is Sunday too
        }
        Ok(Schedule {
            minutes,
            hours,
            days_of_month,
            months,
            days_of_week: days_of_week & 0x7F,
            day_of_month_restricted: !any_day_of_month,
            day_of_week_restricted: !any_day_of_week,
        })
    }
}

impl Schedule {
    fn day_matches(&self, date: NaiveDate) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let by_month_day = self.days_of_month & (1 << date.day()) != 0;
        let by_week_day = self.days_of_week & (1 << date.weekday().num_days_from_sunday()) != 0;
        match (self.day_of_month_restricted, self.day_of_week_restricted) {
            (true, true) => by_month_day || by_week_day,
            (true, false) => by_month_day,
            (false, true) => by_week_day,
            (false, false) => true,
        }
    }

    /// The first time strictly after `after` that the schedule fires, within eight years
    /// (`None` for schedules such as `0 0 30 2 *` that never fire).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let start = after.with_second(0)?.with_nanosecond(0)? + Duration::minutes(1);
        let mut date = start.date_naive();
        for _ in 0..(366 * 8) {
            if self.day_matches(date) {
                let (from_hour, from_minute) =
                    if date == start.date_naive() { (start.hour(), start.minute()) } else { (0, 0) };
                for hour in from_hour..24 {
                    if self.hours & (1 << hour) == 0 {
                        continue;
                    }
                    let first_minute = if hour == from_hour { from_minute } else { 0 };
                    if let Some(minute) = (first_minute..60).find(|minute| self.minutes & (1 << minute) != 0) {
                        return Utc.from_utc_datetime(&date.and_hms_opt(hour, minute, 0)?).into();
                    }
                }
            }
            date = date.succ_opt()?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn next(schedule: &str, after: &str) -> String {
        schedule.parse::<Schedule>().unwrap().next_after(at(after)).unwrap().to_rfc3339()
    }

    #[test]
    fn common_schedules() {
        assert_eq!(next("0 1 * * *", "2026-12-01T00:30:00Z"), "2026-12-01T01:00:00+00:00");
        assert_eq!(next("0 1 * * *", "2026-12-01T01:00:00Z"), "2026-12-02T01:00:00+00:00");
        assert_eq!(next("*/15 * * * *", "2026-12-01T00:31:10Z"), "2026-12-01T00:45:00+00:00");
        assert_eq!(next("* * * * *", "2026-12-01T00:31:59Z"), "2026-12-01T00:32:00+00:00");
        assert_eq!(next("30 2 * * sun", "2026-12-01T00:00:00Z"), "2026-12-06T02:30:00+00:00");
        assert_eq!(next("30 2 * * 7", "2026-12-01T00:00:00Z"), "2026-12-06T02:30:00+00:00");
        assert_eq!(next("0 0 1 jan,jul *", "2026-12-01T00:00:00Z"), "2027-01-01T00:00:00+00:00");
        assert_eq!(next("0 9-17/4 * * mon-fri", "2026-12-05T10:00:00Z"), "2026-12-07T09:00:00+00:00");
        assert_eq!(next("5/20 * * * *", "2026-12-01T00:46:00Z"), "2026-12-01T01:05:00+00:00");
        assert_eq!(next("0 0 29 2 *", "2026-03-01T00:00:00Z"), "2028-02-29T00:00:00+00:00");
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_restricted() {
        // The 15th (a Tuesday in December 2026) or any Friday: Friday the 4th comes first.
        assert_eq!(next("0 0 15 * fri", "2026-12-01T00:00:00Z"), "2026-12-04T00:00:00+00:00");
        assert_eq!(next("0 0 15 * fri", "2026-12-12T00:00:00Z"), "2026-12-15T00:00:00+00:00");
    }

    #[test]
    fn impossible_schedules_never_fire() {
        assert_eq!("0 0 30 2 *".parse::<Schedule>().unwrap().next_after(at("2026-12-01T00:00:00Z")), None);
    }

    #[test]
    fn bad_schedules_are_named() {
        let error = |text: &str| text.parse::<Schedule>().unwrap_err().to_string();
        assert!(error("0 1 * *").contains("must have 5 fields"));
        assert!(error("0 0 0 1 * *").contains("must have 5 fields"), "a seconds field is refused");
        assert!(error("60 * * * *").contains("minute \"60\": 60 is outside 0-59"));
        assert!(error("* 24 * * *").contains("hour"));
        assert!(error("* * 0 * *").contains("day-of-month"));
        assert!(error("* * * 13 *").contains("month"));
        assert!(error("* * * * 8").contains("day-of-week"));
        assert!(error("*/0 * * * *").contains("step must be at least 1"));
        assert!(error("5-1 * * * *").contains("backwards"));
        assert!(error("@daily").contains("5 fields"));
        assert!(error("a * * * *").contains("not a number"));
    }
}
