//! `--deps`: requirements resolved and fetched once, then installed by every worker as it
//! boots, and imported there too. The zygote does it once for all the workers it forks
//! (the zygote, docs/architecture.md §3), so that a session's first call does not pay an install (~0.35 s for `httpx`)
//! and an import (~0.65 s) in each new worker. A worker that booted without them
//! (resolved too late, or failed) gets them at its first call, which reports any error.

use crate::packages::install::InstallPlan;
use crate::packages::resolver::{Planned, ResolveError, Resolver};
use crate::worker::client::Preinstall;
use crate::worker::launcher::PreinstallSource;
use futures::future::{BoxFuture, FutureExt, Shared};
use std::sync::Arc;

/// `--deps` resolved and fetched, shared by every call and every boot that waits for it; the
/// resolver's error (it names the package) when they cannot be had.
pub type StartupPlan = Shared<BoxFuture<'static, Result<Arc<Vec<Planned>>, Arc<ResolveError>>>>;

/// The plan of `deps` (PEP 508 requirements), made by `resolver` when first awaited.
pub fn startup_plan(resolver: Arc<Resolver>, deps: Vec<String>) -> StartupPlan {
    async move {
        if deps.is_empty() {
            return Ok(Arc::new(Vec::new()));
        }
        match resolver.plan(&deps, &[]).await {
            Ok(plan) => Ok(Arc::new(plan)),
            Err(e) => Err(Arc::new(e)),
        }
    }
    .boxed()
    .shared()
}

/// What a booting worker installs for `deps`, from `plan`: `None` without `--deps`; the
/// source yields `None` when the plan failed (each call then reports why).
pub fn preinstall_source(plan: &StartupPlan, deps: &[String]) -> Option<PreinstallSource> {
    if deps.is_empty() {
        return None;
    }
    // The requirements' own distributions are imported; what they depend on comes with them.
    let imports: Vec<String> = deps
        .iter()
        .filter_map(|d| crate::packages::requirement::parse_requirement(d).ok())
        .map(|r| r.name.to_string())
        .collect();
    let plan = plan.clone();
    Some(
        async move {
            let plan = plan.await.ok()?;
            let InstallPlan { files, items, .. } = InstallPlan::of(plan.iter());
            Some(Arc::new(Preinstall {
                files,
                items,
                imports,
                installed: plan
                    .iter()
                    .map(|p| (p.name.clone(), p.version.clone()))
                    .collect(),
            }))
        }
        .boxed()
        .shared(),
    )
}
