//! One read per key in flight: requests that need the same thing while it is being read wait
//! for the same answer.
//!
//! The read runs as a task of its own that removes itself from the table when it ends, so a
//! request that gives up (its deadline, a client gone) never leaves a half-done read behind
//! for a later request to join, and no answer outlives its read.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};

/// Why a flight brought no answer. Every waiter gets a clone of the one answer (a `Shared`
/// future), so the read's own error `E` is `Clone`, and the task's `JoinError`, which is not,
/// is shared behind an `Arc` rather than flattened to its message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FlightError<E> {
    #[error("{0}")]
    Read(E),
    /// The read's task ended without an answer: it panicked, or the runtime is shutting down.
    #[error("{what} failed: {join}")]
    Died {
        what: &'static str,
        #[source]
        join: Arc<tokio::task::JoinError>,
    },
}

type Flight<T, E> = Shared<BoxFuture<'static, Result<T, FlightError<E>>>>;

/// `E` is what a read fails with; a message unless the caller keeps a typed one.
pub struct SingleFlight<K, T, E = String> {
    table: Arc<Mutex<HashMap<K, Flight<T, E>>>>,
}

impl<K, T, E> Default for SingleFlight<K, T, E> {
    fn default() -> Self {
        SingleFlight {
            table: Arc::default(),
        }
    }
}

impl<K, T, E> SingleFlight<K, T, E>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Join the read of `key` under way, or start one with `read` (called at once, under the
    /// table's lock, so it can note what the read began from). `what` names it if its task
    /// dies.
    pub async fn run<F>(
        &self,
        key: K,
        what: &'static str,
        read: impl FnOnce() -> F,
    ) -> Result<T, FlightError<E>>
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
    {
        let flight = {
            let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
            table
                .entry(key.clone())
                .or_insert_with(|| {
                    let (read, table) = (read(), self.table.clone());
                    let task = tokio::spawn(async move {
                        let answer = read.await;
                        // Finished: the next request reads again.
                        table.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                        answer
                    });
                    async move {
                        match task.await {
                            Ok(answer) => answer.map_err(FlightError::Read),
                            Err(join) => Err(FlightError::Died {
                                what,
                                join: Arc::new(join),
                            }),
                        }
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        flight.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_requests_share_one_read_and_the_next_one_reads_again() {
        let flights: Arc<SingleFlight<&'static str, usize>> = Arc::default();
        let reads = Arc::new(AtomicUsize::new(0));
        let ask = || {
            let (flights, reads) = (flights.clone(), reads.clone());
            async move {
                flights
                    .run("ns", "the read", || async move {
                        let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(n)
                    })
                    .await
                    .ok()
            }
        };
        let (a, b, c) = tokio::join!(ask(), ask(), ask());
        assert_eq!((a, b, c), (Some(1), Some(1), Some(1)));
        assert_eq!(ask().await, Some(2), "a finished read is not joined");
        // A request that gives up leaves nothing behind for the next to join.
        let gave_up = tokio::time::timeout(Duration::from_millis(5), ask()).await;
        assert!(gave_up.is_err());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(ask().await, Some(4));
    }
}
