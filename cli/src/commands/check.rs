//! `proftap check PROFILE --budget FILE`: limits per function or region,
//! with an exit status for CI and JUnit XML for CI systems' test reports.
//!
//! The budget file (TOML) has a table per function or region; `calls`
//! limits the calls, and a table per metric limits `average`, `max`,
//! `total` (inclusive costs) or `share` (of the recording):
//!
//! ```toml
//! [function.parse_config]
//! wall.average = "2ms"
//! [function.main]
//! cpu.total = "1.5s"
//! calls = 1
//! [region.inner_loop]
//! wall.share = "40%"
//! ```

use crate::report::text::{format_value, group_digits};
use crate::status::paint;
use anyhow::{Context, Result, bail};
use proftap_profile::{Budget, Measure, Outcome, Subject, Unit};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Budget files larger than this are refused unread.
const MOST_BUDGET_BYTES: u64 = 4 << 20;

/// Arguments of `proftap check`.
#[derive(clap::Args)]
pub struct Args {
    /// The profile to check (default proftap.profile).
    #[arg(default_value = "proftap.profile", value_name = "PROFILE")]
    profile: PathBuf,
    /// The budgets: a TOML file of limits per function and region.
    #[arg(short = 'b', long, value_name = "FILE")]
    budget: PathBuf,
    /// text, or json.
    #[arg(long, default_value = "text")]
    format: String,
    /// Also write the outcomes as JUnit XML to FILE (`-`: standard output),
    /// a test case per budget.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
}

/// Runs the command: exit status 1 when a budget does not hold.
pub fn run(args: Args) -> Result<ExitCode> {
    let budgets = read_budgets(&args.budget)?;
    let profile = proftap_profile::read_profile(&args.profile)?;
    let outcomes = proftap_profile::check(&profile, &budgets);
    match args.format.as_str() {
        "json" => println!("{}", serde_json::to_string_pretty(&outcomes)?),
        "text" => print!("{}", render(&outcomes, &args)),
        other => bail!("unknown format '{other}': text or json"),
    }
    if let Some(path) = &args.junit {
        let xml = junit(&outcomes, &args.profile)?;
        crate::output::write_output(path, |out| out.write_all(xml.as_bytes()))?;
    }
    Ok(if outcomes.iter().all(Outcome::held) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Reads and checks a budget file.
fn read_budgets(path: &Path) -> Result<Vec<Budget>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot read the budget file {}", path.display()))?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MOST_BUDGET_BYTES + 1), &mut text)
        .with_context(|| format!("cannot read the budget file {} (it must be UTF-8 text)", path.display()))?;
    if text.len() as u64 > MOST_BUDGET_BYTES {
        bail!("the budget file {} is larger than {} MiB", path.display(), MOST_BUDGET_BYTES >> 20);
    }
    let table: toml::Table = text.parse().with_context(|| format!("{} is not valid TOML", path.display()))?;
    parse_budgets(&table).with_context(|| format!("in the budget file {}", path.display()))
}

/// The budgets a parsed file states.
fn parse_budgets(table: &toml::Table) -> Result<Vec<Budget>> {
    let mut budgets = Vec::new();
    for (kind, subjects) in table {
        let make: fn(String) -> Subject = match kind.as_str() {
            "function" => Subject::Function,
            "region" => Subject::Region,
            other => bail!("'{other}' is not a kind of budget: [function.NAME] or [region.NAME]"),
        };
        let subjects = subjects.as_table().with_context(|| format!("'{kind}' must be a table of names: [{kind}.NAME]"))?;
        for (name, limits) in subjects {
            let limits = limits.as_table().with_context(|| format!("[{kind}.{name}] must be a table of limits"))?;
            for (key, value) in limits {
                let subject = make(name.clone());
                if key == "calls" {
                    let limit =
                        value.as_integer().filter(|n| *n >= 0).with_context(|| format!("{kind} {name}: calls is a whole number"))?;
                    budgets.push(Budget { subject, metric: String::new(), measure: Measure::Calls, limit: limit as f64 });
                    continue;
                }
                let metric = proftap_probes::metrics::Metric::parse(key)
                    .with_context(|| format!("{kind} {name}: '{key}' is neither calls nor a metric"))?
                    .key()
                    .to_string();
                let measures = value.as_table().with_context(|| format!("{kind} {name}: {key} takes average, max, total or share"))?;
                for (measure, limit) in measures {
                    let measure = match measure.as_str() {
                        "average" => Measure::Average,
                        "max" => Measure::Max,
                        "total" => Measure::Total,
                        "share" => Measure::Share,
                        other => bail!("{kind} {name}: '{other}' is not average, max, total or share"),
                    };
                    let limit = parse_limit(limit, measure, Unit::of(&metric)).with_context(|| format!("{kind} {name}: {key}"))?;
                    budgets.push(Budget { subject: subject.clone(), metric: metric.clone(), measure, limit });
                }
            }
        }
    }
    if budgets.is_empty() {
        bail!("it states no budget");
    }
    Ok(budgets)
}

/// A limit as written: `"40%"` (or 40) for shares, `"2ms"` (or nanoseconds)
/// for times, a number for counts.
fn parse_limit(value: &toml::Value, measure: Measure, unit: Unit) -> Result<f64> {
    let number = match value {
        toml::Value::Integer(n) => Some(*n as f64),
        toml::Value::Float(x) => Some(*x),
        _ => None,
    };
    let limit = match (measure, unit, number, value.as_str()) {
        (Measure::Share, _, Some(percent), _) => percent / 100.0,
        (Measure::Share, _, None, Some(text)) => {
            text.trim().strip_suffix('%').and_then(|p| p.trim().parse::<f64>().ok()).context("a share is written \"40%\"")? / 100.0
        }
        (_, Unit::Nanoseconds, None, Some(text)) => parse_time(text)?,
        (_, _, Some(n), _) => n,
        _ => bail!("a limit is a number, a time (\"2ms\") or a share (\"40%\")"),
    };
    if !(limit.is_finite() && limit >= 0.0) {
        bail!("a limit is a number of at least 0");
    }
    Ok(limit)
}

/// `"2ms"`, `"1.5 s"`, `"800us"`, `"150ns"`: nanoseconds.
fn parse_time(text: &str) -> Result<f64> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        _ => bail!("'{text}' is not a time like \"2ms\", \"1.5s\" or \"800us\""),
    };
    Ok(number.parse::<f64>().with_context(|| format!("'{text}' is not a time like \"2ms\""))? * scale)
}

/// `function parse_config: wall average`.
fn title(b: &Budget) -> String {
    let subject = match &b.subject {
        Subject::Function(name) => format!("function {name}"),
        Subject::Region(name) => format!("region {name}"),
    };
    let measure = match b.measure {
        Measure::Calls => return format!("{subject}: calls"),
        Measure::Average => "average",
        Measure::Max => "max",
        Measure::Total => "total",
        Measure::Share => "share",
    };
    format!("{subject}: {} {measure}", crate::report::text::metric_label(&b.metric))
}

/// A value of `b`'s kind, as a user reads it.
fn show(b: &Budget, value: f64) -> String {
    match b.measure {
        Measure::Share => format!("{:.1}%", value * 100.0),
        Measure::Calls => group_digits(value as u64),
        _ => format_value(&b.metric, value.round() as u64),
    }
}

/// What an outcome says, in a line.
fn verdict(o: &Outcome) -> String {
    match &o.value {
        Ok(value) => format!("{} (limit {})", show(&o.budget, *value), show(&o.budget, o.budget.limit)),
        Err(missing) => format!("cannot be checked: {missing}"),
    }
}

fn render(outcomes: &[Outcome], args: &Args) -> String {
    let mut out = String::new();
    let colour = crate::status::colour(&std::io::stdout());
    let _ = writeln!(out, "proftap check: {} against {}", args.profile.display(), args.budget.display());
    for o in outcomes {
        let mark = if o.held() { paint("held  ", 32, colour) } else { paint("BROKEN", 31, colour) };
        let _ = writeln!(out, "  {mark}  {}: {}", title(&o.budget), verdict(o));
    }
    let broken = outcomes.iter().filter(|o| !o.held()).count();
    let _ = writeln!(out, "{} budgets: {} held, {broken} broken", outcomes.len(), outcomes.len() - broken);
    out
}

/// The outcomes as a JUnit XML report: a test case per budget.
fn junit(outcomes: &[Outcome], profile: &Path) -> Result<String> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut suite = TestSuite::new("proftap budgets");
    for o in outcomes {
        let status = if o.held() {
            TestCaseStatus::success()
        } else {
            let mut failure = TestCaseStatus::non_success(NonSuccessKind::Failure);
            failure.set_message(verdict(o));
            failure
        };
        let mut case = TestCase::new(title(&o.budget), status);
        case.set_classname(profile.display().to_string());
        suite.add_test_case(case);
    }
    let mut report = Report::new("proftap check");
    report.add_test_suite(suite);
    report.to_string().context("cannot write the JUnit report")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_files_say_limits_in_the_units_people_write() {
        let table: toml::Table = r#"
            [function.parse]
            wall.average = "2ms"
            cpu.total = 1500000000
            calls = 10
            [region.loop]
            wall.share = "40%"
        "#
        .parse()
        .expect("toml");
        let budgets = parse_budgets(&table).expect("budgets");
        let limits: Vec<(Measure, &str, f64)> = budgets.iter().map(|b| (b.measure, b.metric.as_str(), b.limit)).collect();
        assert_eq!(
            limits,
            [
                (Measure::Average, "wall_ns", 2e6),
                (Measure::Total, "cpu_ns", 1.5e9),
                (Measure::Calls, "", 10.0),
                (Measure::Share, "wall_ns", 0.4)
            ]
        );
        assert_eq!(parse_time("1.5 s").expect("time"), 1.5e9);
        assert_eq!(parse_time("800us").expect("time"), 800e3);
    }

    #[test]
    fn mistakes_in_budget_files_are_named() {
        for (text, expect) in [
            ("[fn.main]\ncalls = 1", "'fn' is not a kind of budget"),
            ("[function.main]\nwall.mean = \"1ms\"", "'mean' is not average, max, total or share"),
            ("[function.main]\nwall.average = \"fast\"", "'fast' is not a time"),
            ("[function.main]\ncalls = -1", "calls is a whole number"),
            ("[function.main]\nwall.share = \"40\"", "a share is written"),
            ("[function.main]\nbogus.total = 1", "'bogus' is neither calls nor a metric"),
            ("", "it states no budget"),
        ] {
            let table: toml::Table = text.parse().expect("toml");
            let error = parse_budgets(&table).expect_err(text);
            assert!(format!("{error:#}").contains(expect), "{text}: {error:#}");
        }
    }
}
