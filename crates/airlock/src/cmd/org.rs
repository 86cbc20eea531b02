//! `airlock org budget get|set`: the caller's organization on an `airlock
//! serve` (`--server`, its key in `AIRLOCK_API_KEY`), through `/v1/org/budget`.

use std::process::ExitCode;

use airlock_api::v1;
use anyhow::{Result, anyhow};
use clap::Subcommand;

use super::out::outln;

#[derive(clap::Args)]
pub struct OrgArgs {
    /// The `airlock serve` to ask (default: AIRLOCK_SERVER; the
    /// organization's key in AIRLOCK_API_KEY).
    #[arg(long, global = true)]
    pub server: Option<String>,
    #[command(subcommand)]
    pub cmd: OrgCommand,
}

#[derive(Subcommand)]
pub enum OrgCommand {
    /// The organization's model budgets per UTC day and month.
    #[command(subcommand)]
    Budget(BudgetCommand),
}

#[derive(Subcommand)]
pub enum BudgetCommand {
    /// The limits and what this day and this month spent.
    #[command(
        after_help = "Examples:\n  airlock org budget get --server http://127.0.0.1:8420\n  airlock org budget get --json | jq .day_spend"
    )]
    Get {
        /// Print the API's answer (`GET /v1/org/budget`) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Changes the limits named; the others keep their value. A limit is a
    /// number, or `none` for no limit.
    #[command(
        after_help = "Examples:\n  airlock org budget set --day-tokens 2000000 --day-cost-usd 25\n  airlock org budget set --month-requests none\n  airlock org budget set --thresholds 0.5,0.9,1"
    )]
    Set {
        /// Tokens per UTC day (input and output together).
        #[arg(long)]
        day_tokens: Option<Limit>,
        /// US dollars per UTC day, at the models' prices.
        #[arg(long)]
        day_cost_usd: Option<UsdLimit>,
        /// Model requests per UTC day.
        #[arg(long)]
        day_requests: Option<Limit>,
        /// Tokens per UTC month.
        #[arg(long)]
        month_tokens: Option<Limit>,
        /// US dollars per UTC month.
        #[arg(long)]
        month_cost_usd: Option<UsdLimit>,
        /// Model requests per UTC month.
        #[arg(long)]
        month_requests: Option<Limit>,
        /// Fractions of each budget at which webhooks subscribed to
        /// budget.threshold are told, comma-separated (0.5,0.8,1), `none`
        /// for none, or `default`.
        #[arg(long)]
        thresholds: Option<ThresholdList>,
        /// Print the API's answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A count limit: a whole number of at least 1, or `none`.
#[derive(Debug, Clone, Copy)]
pub struct Limit(Option<i64>);

impl std::str::FromStr for Limit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(Limit(None));
        }
        match s.parse::<i64>() {
            Ok(n) if n >= 1 => Ok(Limit(Some(n))),
            _ => Err(format!(
                "{s:?} is not a whole number of at least 1, or none"
            )),
        }
    }
}

/// A cost limit in US dollars (kept in millionths), or `none`.
#[derive(Debug, Clone, Copy)]
pub struct UsdLimit(Option<i64>);

impl std::str::FromStr for UsdLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(UsdLimit(None));
        }
        match s.parse::<f64>() {
            Ok(usd) if usd.is_finite() && (1e-6..=1e12).contains(&usd) => {
                // Within ±1e18 µUSD: the cast cannot wrap.
                #[allow(clippy::cast_possible_truncation)]
                let micro = (usd * 1e6).round() as i64;
                Ok(UsdLimit(Some(micro)))
            }
            _ => Err(format!(
                "{s:?} is not an amount of US dollars from 0.000001 to 10^12, or none"
            )),
        }
    }
}

/// Thresholds as fractions (`None`: the server's default).
#[derive(Debug, Clone)]
pub struct ThresholdList(Option<Vec<f64>>);

impl std::str::FromStr for ThresholdList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(ThresholdList(None)),
            "none" => Ok(ThresholdList(Some(Vec::new()))),
            _ => s
                .split(',')
                .map(|f| {
                    f.trim()
                        .parse::<f64>()
                        .map_err(|_| format!("{f:?} is not a fraction (0.5)"))
                })
                .collect::<Result<Vec<f64>, String>>()
                .map(|v| ThresholdList(Some(v))),
        }
    }
}

pub fn run(args: OrgArgs) -> ExitCode {
    crate::logging::init_quiet();
    super::connections::report(
        super::connections::runtime().and_then(|rt| rt.block_on(run_async(args))),
    )
}

const PATH: &str = "/v1/org/budget";

async fn run_async(args: OrgArgs) -> Result<()> {
    let server = super::remote::server(args.server.as_deref()).ok_or_else(|| {
        anyhow!("`airlock org` asks an airlock serve: pass --server http://HOST:PORT (or set AIRLOCK_SERVER)")
    })?;
    let r = super::remote::Remote::new(&server)?;
    let OrgCommand::Budget(cmd) = args.cmd;
    let (budget, json) = match cmd {
        BudgetCommand::Get { json } => (r.get::<v1::OrgBudget>(PATH).await?, json),
        BudgetCommand::Set {
            day_tokens,
            day_cost_usd,
            day_requests,
            month_tokens,
            month_cost_usd,
            month_requests,
            thresholds,
            json,
        } => {
            let now = r.get::<v1::OrgBudget>(PATH).await?;
            let pick = |new: Option<Option<i64>>, old: Option<i64>| new.unwrap_or(old);
            let set = v1::SetOrgBudget {
                day: v1::BudgetLimits {
                    tokens: pick(day_tokens.map(|l| l.0), now.day.tokens),
                    cost_microusd: pick(day_cost_usd.map(|l| l.0), now.day.cost_microusd),
                    requests: pick(day_requests.map(|l| l.0), now.day.requests),
                },
                month: v1::BudgetLimits {
                    tokens: pick(month_tokens.map(|l| l.0), now.month.tokens),
                    cost_microusd: pick(month_cost_usd.map(|l| l.0), now.month.cost_microusd),
                    requests: pick(month_requests.map(|l| l.0), now.month.requests),
                },
                thresholds: thresholds.map_or(Some(now.thresholds), |t| t.0),
            };
            (r.send_json("PUT", PATH, &set).await?, json)
        }
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&budget)?);
    } else {
        print_budget(&budget);
    }
    Ok(())
}

fn print_budget(b: &v1::OrgBudget) {
    for (name, limits, spend) in [
        ("day", &b.day, &b.day_spend),
        ("month", &b.month, &b.month_spend),
    ] {
        let of = |n: i64, l: Option<i64>| match l {
            Some(l) => format!("{n} of {l}"),
            None => format!("{n} (no limit)"),
        };
        #[allow(clippy::cast_precision_loss)] // dollars for reading
        let usd = |m: i64| format!("${:.2}", m as f64 / 1e6);
        let cost = match limits.cost_microusd {
            Some(l) => format!("{} of {}", usd(spend.cost_microusd), usd(l)),
            None => format!("{} (no limit)", usd(spend.cost_microusd)),
        };
        outln!(
            "{name:<5} {}  tokens {}  cost {cost}  requests {}",
            spend.period,
            of(spend.tokens, limits.tokens),
            of(spend.requests, limits.requests),
        );
    }
    let t: Vec<String> = b.thresholds.iter().map(f64::to_string).collect();
    outln!(
        "thresholds {}",
        if t.is_empty() {
            "none".into()
        } else {
            t.join(", ")
        }
    );
}
