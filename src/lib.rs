// kube-derive repeats `type_ = "string"` across printcolumn(...) entries; clippy reads them as
// duplicated attributes of one item.
#![allow(clippy::duplicated_attributes)]

//! cluster-api-provider-kairon: a Cluster API infrastructure provider for Kairon virtual
//! machines.
//!
//! - [`api`]: our CRD types and condition vocabulary;
//! - [`capi`]: read-only views of CAPI core objects and the contract helpers (owners, pause);
//! - [`kairon`]: everything we assume about Kairon's Machine API, in one place;
//! - [`controller`]: the reconcilers (one per kind of ours) and what runs them;
//! - [`manager`]: the binary's wiring (flags, clients, leader election, admin endpoints), with
//!   [`client`] (rate limit and request metrics), [`leader`], [`admin`], [`events`] and
//!   [`metrics`] beside it.
//!
//! Dependencies point one way: `api` ← `capi` ← `kairon` ← `controller` ← `manager`; `events`,
//! `metrics`, `hashing` and `text` depend on none of them.

pub mod admin;
pub mod api;
pub mod capi;
pub mod client;
pub mod controller;
pub mod events;
mod hashing;
pub mod kairon;
pub mod leader;
pub mod manager;
pub mod metrics;
mod text;
pub mod view;
