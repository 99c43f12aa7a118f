//! The routing operator's primitives on Burn's cube backends (CUDA, wgpu).

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::RoutingBackend;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> RoutingBackend
    for CubeBackend<R, F, I, BT>
{
}
