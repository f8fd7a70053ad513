pub mod fake_api;
pub mod https;
pub mod apiserver;
