//! The pages' templates (minijinja, auto-escaped: every value a page shows
//! is text, never markup), compiled once.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse as _, Response};
use minijinja::Environment;

use crate::error::ApiError;

const TEMPLATES: &[(&str, &str)] = &[
    ("layout.html", include_str!("templates/layout.html")),
    ("sign_in.html", include_str!("templates/sign_in.html")),
    ("runs.html", include_str!("templates/runs.html")),
    ("run.html", include_str!("templates/run.html")),
    (
        "connections.html",
        include_str!("templates/connections.html"),
    ),
    ("usage.html", include_str!("templates/usage.html")),
];

static ENV: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    // `.html` names are auto-escaped (minijinja's default).
    for (name, source) in TEMPLATES {
        if let Err(e) = env.add_template(name, source) {
            tracing::error!("console template {name}: {e}");
        }
    }
    env.add_filter("time", time);
    // A value the answer leaves out (`null`) shows as nothing.
    env.set_formatter(|out, state, value| {
        if value.is_none() {
            Ok(())
        } else {
            minijinja::escape_formatter(out, state, value)
        }
    });
    env
});

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
fn time(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return String::new();
    };
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 as a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The page `name` rendered with `ctx`, as an HTML answer.
pub fn page(name: &str, ctx: minijinja::Value) -> Result<Response, ApiError> {
    let html = ENV
        .get_template(name)
        .and_then(|t| t.render(ctx))
        .map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_compiles_and_times_read_as_utc() {
        for (name, _) in TEMPLATES {
            assert!(ENV.get_template(name).is_ok(), "{name}");
        }
        assert_eq!(time(Some(0)), "1970-01-01 00:00:00");
        assert_eq!(time(Some(1_765_069_200_000)), "2025-12-07 01:00:00");
        assert_eq!(time(None), "");
    }

    #[test]
    fn a_missing_value_shows_as_nothing_and_values_are_escaped() {
        let html = ENV
            .get_template("connections.html")
            .unwrap()
            .render(minijinja::context! {
                page => "connections",
                layout => minijinja::context! { org => "<b>Acme</b>", key_id => "k", csrf => "t" },
                connections => vec![minijinja::context! { name => "llm", kid => (), created_at => 0 }],
            })
            .unwrap();
        assert!(html.contains("&lt;b&gt;Acme&lt;&#x2f;b&gt;"), "{html}");
        assert!(!html.contains("none"), "{html}");
        assert!(html.contains("<td>llm</td>"), "{html}");
    }

    #[test]
    fn values_are_escaped() {
        let mut env = Environment::new();
        env.add_template("t.html", "{{ v }}").unwrap();
        let out = env
            .get_template("t.html")
            .unwrap()
            .render(minijinja::context! { v => "<script>x</script>" })
            .unwrap();
        assert_eq!(out, "&lt;script&gt;x&lt;&#x2f;script&gt;");
    }
}
