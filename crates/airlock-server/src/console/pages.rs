//! The console's pages. Each reads its data by calling the `/v1` handler
//! that answers it ([`crate::routes`]) as the signed-in operator's tenant,
//! and renders that answer; a page never queries the store itself.
//!
//! Without a live session a page redirects to the sign-in form. Every
//! form that changes something (sign-in, sign-out, cancelling a run,
//! answering a held request) carries a CSRF token that is checked before
//! anything else.

use airlock_api::v1;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Redirect, Response};
use axum::routing::{get, post};
use minijinja::context;
use serde::Deserialize;

use super::operator::{Operator, now_s};
use super::session::{self, COOKIE, COOKIE_PATH, SIGN_IN_COOKIE};
use super::{assets, preview, render};
use crate::error::ApiError;
use crate::extract::{Path, Query};
use crate::routes::{approvals, connections, keys, runs};
use crate::state::AppState;

pub const SIGN_IN: &str = "/console/sign-in";

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/console", get(home))
        .route("/console/", get(home))
        .route(SIGN_IN, get(sign_in_form).post(sign_in))
        .route("/console/sign-out", post(sign_out))
        .route("/console/runs", get(runs_page))
        .route("/console/runs/{id}", get(run_page))
        .route("/console/runs/{id}/cancel", post(cancel))
        .route("/console/runs/{id}/approvals/{approval_id}", post(answer))
        .route("/console/connections", get(connections_page))
        .route("/console/usage", get(usage_page))
        .route("/console/assets/console.js", get(assets::script))
        .route("/console/assets/console.css", get(assets::style))
}

/// A page's answer: rendered, or where to go instead.
type Page = Result<Response, Response>;

fn fail(e: ApiError) -> Response {
    e.into_response()
}

/// The signed-in operator, or a redirect to the sign-in form.
async fn operator(app: &AppState, headers: &HeaderMap) -> Result<Operator, Response> {
    match Operator::of(app, headers).await {
        Ok(Some(op)) => Ok(op),
        Ok(None) => Err(Redirect::to(SIGN_IN).into_response()),
        Err(e) => Err(fail(e)),
    }
}

/// What every signed-in page's layout shows: the organization and the
/// sign-out form's CSRF token.
async fn layout(app: &AppState, op: &Operator) -> Result<minijinja::Value, Response> {
    let org = keys::get_org(State(app.clone()), op.tenant.clone())
        .await
        .map_err(fail)?
        .0;
    Ok(context! {
        org => org.name,
        key_id => op.tenant.key_id,
        csrf => app.cfg().console.sessions.csrf(&op.session),
    })
}

async fn home() -> Redirect {
    Redirect::to("/console/runs")
}

/// The sign-in form, with a fresh CSRF pair (its cookie and its field).
fn sign_in_page(headers: &HeaderMap, status: StatusCode, error: Option<&str>) -> Response {
    let token = match airlock_vault::random_hex::<16>() {
        Ok(t) => t,
        Err(e) => return fail(ApiError::internal(e)),
    };
    let cookie = session::set_cookie(
        SIGN_IN_COOKIE,
        &token,
        SIGN_IN,
        session::SIGN_IN_SECONDS,
        session::over_https(headers),
    );
    match render::page("sign_in.html", context! { csrf => token, error }) {
        Ok(mut res) => {
            *res.status_mut() = status;
            set(&mut res, cookie);
            res
        }
        Err(e) => fail(e),
    }
}

fn set(res: &mut Response, cookie: String) {
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
}

async fn sign_in_form(headers: HeaderMap) -> Response {
    sign_in_page(&headers, StatusCode::OK, None)
}

#[derive(Deserialize)]
struct SignIn {
    key: String,
    csrf: String,
}

/// Opens a session for a live API key: the form's token must equal its
/// cookie; a client address that keeps failing is slowed down as on `/v1`.
async fn sign_in(State(app): State<AppState>, req: axum::extract::Request) -> Page {
    use axum::extract::{ConnectInfo, FromRequest as _};
    let client = req
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip().to_string());
    let headers = req.headers().clone();
    let Form(f) = Form::<SignIn>::from_request(req, &app)
        .await
        .map_err(|e| fail(ApiError::bad_request(e.body_text())))?;
    let paired = session::cookie(&headers, SIGN_IN_COOKIE)
        .is_some_and(|c| !c.is_empty() && airlock_vault::ct_eq(c.as_bytes(), f.csrf.as_bytes()));
    if !paired {
        return Err(sign_in_page(
            &headers,
            StatusCode::FORBIDDEN,
            Some("the form expired; sign in again"),
        ));
    }
    let tenant = match app.auth().authenticate(app.store(), f.key.trim()).await {
        Ok(t) => t,
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            if let Some(Err(wait)) = client.as_deref().map(|c| app.auth_failures().check(c)) {
                let secs = wait.as_secs().saturating_add(1);
                return Err(fail(ApiError::too_many(secs)));
            }
            return Err(sign_in_page(
                &headers,
                StatusCode::UNAUTHORIZED,
                Some("that API key is not valid (or was revoked)"),
            ));
        }
        Err(e) => return Err(fail(e)),
    };
    let (_, value) = app
        .cfg()
        .console
        .sessions
        .open(&tenant.key_id, now_s())
        .map_err(|e| fail(ApiError::internal(e)))?;
    let https = session::over_https(&headers);
    // 303: the browser follows with a GET.
    let mut res = Redirect::to("/console/runs").into_response();
    set(
        &mut res,
        session::set_cookie(
            COOKIE,
            &value,
            COOKIE_PATH,
            session::LIFETIME_SECONDS,
            https,
        ),
    );
    set(
        &mut res,
        session::set_cookie(SIGN_IN_COOKIE, "", SIGN_IN, 0, https),
    );
    Ok(res)
}

#[derive(Deserialize)]
struct Csrf {
    csrf: String,
}

/// The operator of a form, its CSRF token checked.
async fn form_operator(
    app: &AppState,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<Operator, Response> {
    let op = operator(app, headers).await?;
    if !app.cfg().console.sessions.csrf_ok(&op.session, csrf) {
        return Err(fail(ApiError::new(
            StatusCode::FORBIDDEN,
            "csrf",
            "the form's CSRF token is not this session's",
        )));
    }
    Ok(op)
}

async fn sign_out(State(app): State<AppState>, headers: HeaderMap, Form(f): Form<Csrf>) -> Page {
    form_operator(&app, &headers, &f.csrf).await?;
    let mut res = Redirect::to(SIGN_IN).into_response();
    let https = session::over_https(&headers);
    set(
        &mut res,
        session::set_cookie(COOKIE, "", COOKIE_PATH, 0, https),
    );
    Ok(res)
}

/// The runs list's filters, as its form sends them (empty: no filter).
#[derive(Deserialize, Default)]
struct Filters {
    status: Option<String>,
    agent: Option<String>,
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

async fn runs_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(f): Query<Filters>,
) -> Page {
    let op = operator(&app, &headers).await?;
    let q = v1::RunsQuery {
        status: non_empty(f.status),
        agent: non_empty(f.agent),
        ..Default::default()
    };
    let list = runs::list(State(app.clone()), op.tenant.clone(), Query(q.clone()))
        .await
        .map_err(fail)?
        .0;
    let statuses: Vec<&str> = airlock_store::RunStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .collect();
    let waiting: i64 = list.runs.iter().filter_map(|r| r.pending_approvals).sum();
    render::page(
        "runs.html",
        context! {
            page => "runs",
            layout => layout(&app, &op).await?,
            waiting,
            runs => list.runs,
            status => q.status,
            agent => q.agent,
            statuses,
        },
    )
    .map_err(fail)
}

/// A run's timeline, from what its row stores, in the order its phases
/// come: queued, started (the platform took it up: `started_at`, before its
/// sandbox is made), its sandbox up, its sidecar up (the agent let go: it
/// runs from here), ended.
fn timeline(run: &v1::Run) -> Vec<(&'static str, Option<i64>)> {
    vec![
        ("queued", Some(run.created_at)),
        ("started", run.started_at),
        ("sandbox up", run.sandbox_up_at),
        ("sidecar up, running", run.sidecar_up_at),
        ("ended", run.ended_at),
    ]
}

async fn run_page(State(app): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Page {
    let op = operator(&app, &headers).await?;
    let t = &op.tenant;
    let run = runs::get(State(app.clone()), t.clone(), Path(id.clone()))
        .await
        .map_err(fail)?
        .0;
    let egress = runs::egress(
        State(app.clone()),
        t.clone(),
        Path(id.clone()),
        Query(v1::LimitQuery { limit: Some(1000) }),
    )
    .await
    .map_err(fail)?
    .0;
    let cost = runs::cost(State(app.clone()), t.clone(), Path(id.clone()))
        .await
        .map_err(fail)?
        .0;
    let result = runs::last_result(&app, t, &id).await.map_err(fail)?;
    let preview = result
        .as_ref()
        .and_then(v1::html_result)
        .map(|_| preview::url(&app, &id));
    let result_text = result
        .as_ref()
        .map(|r| serde_json::to_string_pretty(r).unwrap_or_default());
    let terminal = airlock_store::RunStatus::parse(&run.status).is_some_and(|s| s.is_terminal());
    let approvals = approvals::list(State(app.clone()), t.clone(), Path(id.clone()))
        .await
        .map_err(fail)?
        .0
        .approvals;
    let pending: Vec<&str> = approvals
        .iter()
        .filter(|a| a.state == v1::ApprovalState::Pending)
        .map(|a| a.id.as_str())
        .collect();
    render::page(
        "run.html",
        context! {
            page => "run",
            layout => layout(&app, &op).await?,
            timeline => timeline(&run),
            terminal,
            run,
            egress => egress.egress,
            pending => pending.join(" "),
            approvals,
            cost,
            result => result_text,
            preview,
        },
    )
    .map_err(fail)
}

async fn cancel(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Csrf>,
) -> Page {
    let op = form_operator(&app, &headers, &f.csrf).await?;
    match runs::cancel(State(app.clone()), op.tenant, Path(id.clone())).await {
        // The run exists (its id is one the platform made): back to its
        // page, which says how it ended.
        Ok(_) => {}
        Err(e) if e.status == StatusCode::CONFLICT => {}
        Err(e) => return Err(fail(e)),
    }
    Ok(Redirect::to(&format!("/console/runs/{id}")).into_response())
}

/// A person's answer to a held request, from the run's page.
#[derive(Deserialize)]
struct Answer {
    csrf: String,
    /// `allow_once`, `allow_run` or `deny` (the button pressed).
    decision: String,
}

/// Answers a held request as the signed-in operator (its key is who
/// answered, in the approval and the audit), through the `/v1` handler;
/// back to the run's page, which shows how it stands (an approval answered
/// meanwhile, or whose run ended, is no error: the page says so).
async fn answer(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((id, approval_id)): Path<(String, String)>,
    Form(f): Form<Answer>,
) -> Page {
    let op = form_operator(&app, &headers, &f.csrf).await?;
    let decision =
        serde_json::from_value::<v1::ApprovalDecision>(f.decision.into()).map_err(|_| {
            fail(ApiError::bad_request(
                "decision: allow_once, allow_run or deny",
            ))
        })?;
    let body = crate::extract::Json(v1::AnswerApproval { decision });
    match approvals::answer(
        State(app.clone()),
        op.tenant,
        Path((id.clone(), approval_id)),
        body,
    )
    .await
    {
        Ok(_) => {}
        Err(e) if e.status == StatusCode::CONFLICT => {}
        Err(e) => return Err(fail(e)),
    }
    Ok(Redirect::to(&format!("/console/runs/{id}")).into_response())
}

async fn connections_page(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let op = operator(&app, &headers).await?;
    let list = connections::list(State(app.clone()), op.tenant.clone())
        .await
        .map_err(fail)?
        .0;
    render::page(
        "connections.html",
        context! {
            page => "connections",
            layout => layout(&app, &op).await?,
            connections => list.connections,
        },
    )
    .map_err(fail)
}

async fn usage_page(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let op = operator(&app, &headers).await?;
    render::page(
        "usage.html",
        context! { page => "usage", layout => layout(&app, &op).await? },
    )
    .map_err(fail)
}
