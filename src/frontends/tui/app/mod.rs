//! State, the actions that change it, and how input becomes actions.

pub mod input;
pub mod merge;
pub mod node;
pub mod rows;
pub mod state;
