//! Where a step's time goes: a steady CPU step operation by operation, beside PyTorch's profiler
//! ([`anatomy`], reported by [`anatomy_report`]); a first step from the backend's start to the
//! update, with CubeCL's compilations, across depths ([`first_step`]); and a steady GPU step
//! kernel by kernel, by device time ([`kernel_times`]).

pub mod anatomy;
pub mod anatomy_report;
pub mod first_step;
pub mod kernel_times;
