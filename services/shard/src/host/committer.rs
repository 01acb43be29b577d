//! A host's committer: the one task that writes each pending batch to the store in one transaction and only
//! then publishes it (durable before visible), in order; a batch the store refuses for good goes to
//! [`crate::host::salvage`].

use std::sync::Weak;

use relay_core::telemetry::CommitTimer;

use crate::host::batches::Written;
use crate::host::Host;

/// The host's committer: writes each pending batch in one transaction, then publishes it.
///
/// A batch that fails to commit is retried with backoff and is never published before it commits; replies
/// waiting on it wait too (design §6, invariant 2). A failed attempt that went through all the same (its
/// answer was lost) is not written again.
pub(crate) async fn commit_loop(host: Weak<Host>) {
    loop {
        let Some(strong) = host.upgrade() else {
            return;
        };
        let batch = strong.core.lock().seq.take_pending();
        if batch.is_empty() {
            if strong.is_deposed() {
                return;
            }
            // Wait for more work without keeping the host alive: dropping the host wakes this loop too, and
            // it then ends (an idle host's memory is freed once it is evicted).
            let wakeup = strong.wakeup.clone();
            drop(strong);
            wakeup.notified().await;
            continue;
        }
        if strong.is_deposed() {
            return;
        }
        let number = batch.number;
        let timer = CommitTimer::start(batch.envelope_count());
        let span = tracing::info_span!(
            "ahp.commit",
            host = %strong.key,
            batch = number,
            envelopes = timer.envelopes()
        );
        let (commit, publications, units) = batch.into_parts();
        match strong.write(&commit, &span).await {
            Written::Committed => {}
            Written::Deposed => return,
            Written::Refused(error) => {
                // Writing this batch can never succeed (e.g. a value over the database's limits, or a trigger
                // that refuses it). It was never published, so no client saw it: its units are written one by
                // one, and only the ones at fault (and those reduced on top of them) fail, each with a
                // rejection to its sender; the host keeps serving everyone.
                tracing::error!(host = %strong.key, %error, "a commit failed permanently; writing its units one by one");
                if !crate::host::salvage::commit_units(&strong, units.split(commit, publications), &span)
                    .await
                {
                    return;
                }
                timer.finish();
                finish_batch(&strong, number);
                continue;
            }
        }
        if strong.is_deposed() {
            // Deposed while committing (e.g. the lease was released or lost): committed, but the bus is
            // closed; the next owner publishes nothing of it either — clients get it by resuming.
            return;
        }
        timer.finish();
        strong.publish(publications).await;
        finish_batch(&strong, number);
    }
}

/// Batch `number` is done (committed, or what could be of it): replies waiting on it go, and channels whose
/// disposal it carried may be read from the store again.
fn finish_batch(host: &Host, number: u64) {
    host.durable.send_replace(number);
    let mut core = host.core.lock();
    if !core.disposing.is_empty() {
        core.disposing.retain(|_, batch| *batch > number);
    }
}
