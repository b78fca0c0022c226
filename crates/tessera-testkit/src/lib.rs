pub mod grantlog;
pub mod worker;
