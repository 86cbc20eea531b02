//! `organizations`: the tenants of `airlock serve`, each with its own
//! ceiling on running runs.
//!
//! Contract: an organization's id is chosen by its operator and never
//! reused ([`StoreError::Invalid`] when taken).
//!
//! Bounds: written only by the operator (`airlock org create`), never
//! through a tenant's API.

use sqlx::Row as _;

use crate::{Store, StoreError, is_unique_violation, now_ms, validate_name};

/// An organization (a tenant of `airlock serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Organization {
    pub id: String,
    pub name: String,
    /// Its own ceiling on running runs (`None`: only the platform's).
    pub max_concurrent_runs: Option<i64>,
    pub created_at: i64,
}

/// Maps an `organizations` row to [`Organization`].
macro_rules! org_row {
    ($r:expr, $s:expr) => {
        Organization {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            name: $r.try_get("name").map_err(|e| $s.err(e))?,
            max_concurrent_runs: $r.try_get("max_concurrent_runs").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
        }
    };
}

impl Store {
    pub async fn create_org(
        &self,
        id: &str,
        name: &str,
        max_concurrent_runs: Option<i64>,
    ) -> Result<Organization, StoreError> {
        validate_name("organization id", id)?;
        validate_name("organization name", name)?;
        let now = now_ms();
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO organizations (id, name, max_concurrent_runs, created_at) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(name)
        .bind(max_concurrent_runs)
        .bind(now)
        .execute(p)
        .await
        .map(|_| ()));
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::Invalid {
                what: "organization id",
                reason: "already exists",
            }),
            Err(e) => Err(self.err(e)),
            Ok(_) => Ok(Organization {
                id: id.to_owned(),
                name: name.to_owned(),
                max_concurrent_runs,
                created_at: now,
            }),
        }
    }

    pub async fn get_org(&self, id: &str) -> Result<Option<Organization>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT id, name, max_concurrent_runs, created_at FROM organizations WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<Organization, StoreError> { Ok(org_row!(r, self)) })
                .transpose()
        })
    }

    pub async fn list_orgs(&self) -> Result<Vec<Organization>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, name, max_concurrent_runs, created_at FROM organizations ORDER BY created_at, id",
            )
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(org_row!(r, self))).collect()
        })
    }

    /// The name of the operator proxy (`SYSTEM_PROXIES`) the organization
    /// chose (`None`: none chosen). The name is checked against the
    /// operator's list by the caller; the store keeps only the name.
    pub async fn org_proxy(&self, org: &str) -> Result<Option<String>, StoreError> {
        on_pool!(self, p => {
            let v: Option<Option<String>> =
                sqlx::query_scalar("SELECT proxy FROM organizations WHERE id = $1")
                    .bind(org)
                    .fetch_optional(p)
                    .await
                    .map_err(|e| self.err(e))?;
            Ok(v.flatten())
        })
    }

    /// Sets (or with `None` clears) the organization's proxy choice;
    /// [`StoreError::Invalid`] when no such organization exists.
    pub async fn set_org_proxy(&self, org: &str, proxy: Option<&str>) -> Result<(), StoreError> {
        let n = on_pool!(self, p => sqlx::query("UPDATE organizations SET proxy = $2 WHERE id = $1")
            .bind(org)
            .bind(proxy)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        if n == 0 {
            return Err(StoreError::Invalid {
                what: "organization id",
                reason: "does not exist",
            });
        }
        Ok(())
    }
}
