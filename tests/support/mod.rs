pub mod apiserver;
pub mod fake_api;
pub mod https;
pub mod kcp;
pub mod mgmt;
pub mod netns;
pub mod providers;
