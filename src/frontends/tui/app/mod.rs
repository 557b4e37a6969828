//! State, the actions that change it, and how input becomes actions.

pub mod action;
pub mod input;
pub mod jobs;
pub mod lists;
pub mod merge;
pub mod node;
pub mod rows;
pub mod state;
