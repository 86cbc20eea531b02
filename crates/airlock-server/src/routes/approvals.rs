//! A run's held requests and a person's answer to each (docs/egress.md,
//! "Human approval"). Only a key of the run's organization reads or
//! answers them: another organization's run or approval is a 404, as an
//! unknown id. An approval is answered once (409 after); a run that ended
//! has its pending approvals dropped (answering them is 409).

use airlock_api::v1;
use airlock_platform::approvals::{ApprovalError, Decision};
use airlock_store::RunStatus;
use axum::extract::State;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::{Json, Path};
use crate::routes::runs::the_run;
use crate::state::AppState;

/// A run's approvals, oldest first: pending ones wait for an answer.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/approvals",
    operation_id = "list_run_approvals",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id")),
    responses(
        (status = 200, description = "the run's approvals", body = v1::ApprovalList),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn list(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<v1::ApprovalList>> {
    let run = the_run(&app, &t, &id).await?;
    if run.status != RunStatus::Running {
        drop_ended(&app, &id).await?;
    }
    let rows = app.store().list_approvals(&t.org_id, &id).await?;
    Ok(axum::Json(v1::ApprovalList {
        approvals: rows.iter().map(v1::Approval::from).collect(),
    }))
}

/// Answers a held request: allow it once, allow it (and every later
/// request of the run matching the same rule, method and host) for the
/// run, or deny it. The answer and the key that gave it are in the run's
/// audit.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/approvals/{approval_id}",
    operation_id = "answer_run_approval",
    tag = "runs",
    security(("apiKey" = [])),
    params(
        ("id" = String, Path, description = "the run's id"),
        ("approval_id" = String, Path, description = "the approval's id"),
    ),
    request_body = v1::AnswerApproval,
    responses(
        (status = 200, description = "answered: the approval as it now stands", body = v1::Approval),
        (status = 404, description = "not_found: no such run or approval in the caller's organization", body = v1::Error),
        (status = 409, description = "conflict: the approval is no longer pending (answered, expired, or its run ended)", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn answer(
    State(app): State<AppState>,
    t: Tenant,
    Path((id, approval_id)): Path<(String, String)>,
    Json(body): Json<v1::AnswerApproval>,
) -> ApiResult<axum::Json<v1::Approval>> {
    let run = the_run(&app, &t, &id).await?;
    if run.status != RunStatus::Running {
        drop_ended(&app, &id).await?;
    }
    let decision = match body.decision {
        v1::ApprovalDecision::AllowOnce => Decision::AllowOnce,
        v1::ApprovalDecision::AllowRun => Decision::AllowRun,
        v1::ApprovalDecision::Deny => Decision::Deny,
    };
    let answered = app
        .orch()
        .api
        .approvals()
        .answer(
            app.store(),
            (&t.org_id, &id, &approval_id),
            decision,
            &t.key_id,
        )
        .await;
    match answered {
        Ok(row) => Ok(axum::Json(v1::Approval::from(&row))),
        Err(ApprovalError::NotFound) => Err(ApiError::not_found("approval")),
        Err(ApprovalError::Settled(state)) => Err(ApiError::conflict(format!(
            "the approval is already {state}"
        ))),
        Err(ApprovalError::Store(e)) => Err(e.into()),
        Err(
            e @ (ApprovalError::Exhausted { .. } | ApprovalError::Id(_) | ApprovalError::RunEnding),
        ) => Err(ApiError::internal(e)),
    }
}

/// A run that ended holds nothing: what is still pending (its replica
/// gone before it could drop them) is dropped.
async fn drop_ended(app: &AppState, run_id: &str) -> ApiResult<()> {
    app.orch()
        .api
        .approvals()
        .drop_run(app.store(), run_id)
        .await
        .map_err(ApiError::from)
}
