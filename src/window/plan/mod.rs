//! What each command does next, pure: a planner per command (`move_next`, `window_next`,
//! `directory_next`), the decisions they share (`move_plan` for clusterctl's move,
//! `directory_plan` for a backup and a restore, `stop` for how each Deployment is stopped
//! and restored, `proof` for when a stop is proven), the `Planner` trait the runner drives,
//! and `declare`, which names each step once. Nothing here does I/O: the tests beside each
//! walk every path without a cluster.

pub mod all_namespaces;
pub mod all_next;
pub mod declare;
pub mod directory_next;
pub mod directory_plan;
pub mod left_behind;
pub mod move_next;
pub mod move_plan;
pub mod planner;
pub mod proof;
pub mod stop;
pub mod window_next;
