//! What a home's SQLite store weighs.

use std::path::Path;

/// The bytes the store's database in `home` uses (its pages in use, what the
/// write-ahead log holds included), as SQLite counts them: neither the WAL
/// file's length nor free pages count. Panics (the caller's failure) when the
/// store cannot be read.
pub fn store_bytes(home: &Path) -> u64 {
    use sqlx::Connection as _;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let url = format!("sqlite://{}?mode=ro", home.join("airlock.db").display());
        let mut c = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("the store opens read-only");
        let n = |q: &'static str| sqlx::query_scalar::<_, i64>(q);
        let pages = n("PRAGMA page_count").fetch_one(&mut c).await;
        let free = n("PRAGMA freelist_count").fetch_one(&mut c).await;
        let size = n("PRAGMA page_size").fetch_one(&mut c).await;
        let (pages, free, size) = (
            pages.expect("page_count"),
            free.expect("freelist_count"),
            size.expect("page_size"),
        );
        c.close().await.expect("the store closes");
        u64::try_from((pages - free) * size).unwrap_or(0)
    })
}
