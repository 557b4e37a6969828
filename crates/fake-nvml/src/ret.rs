//! NVML return codes (`nvmlReturn_t`), their `nvmlErrorString` texts, and the names a scenario
//! uses for them.

use serde::Deserialize;
use std::ffi::CStr;

/// `nvmlReturn_t` is a C enum, passed as a 32-bit unsigned int.
pub type Ret = u32;

pub const SUCCESS: Ret = 0;
pub const UNINITIALIZED: Ret = 1;
pub const INVALID_ARGUMENT: Ret = 2;
pub const NOT_SUPPORTED: Ret = 3;
pub const NOT_FOUND: Ret = 6;
pub const INSUFFICIENT_SIZE: Ret = 7;
pub const DRIVER_NOT_LOADED: Ret = 9;
pub const ARGUMENT_VERSION_MISMATCH: Ret = 25;
pub const UNKNOWN: Ret = 999;

/// An NVML error as named in a scenario file (`error = "gpu_is_lost"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorName {
    Uninitialized,
    InvalidArgument,
    NotSupported,
    NoPermission,
    AlreadyInitialized,
    NotFound,
    InsufficientSize,
    InsufficientPower,
    DriverNotLoaded,
    Timeout,
    IrqIssue,
    LibraryNotFound,
    FunctionNotFound,
    CorruptedInforom,
    GpuIsLost,
    ResetRequired,
    OperatingSystem,
    LibRmVersionMismatch,
    InUse,
    Memory,
    NoData,
    VgpuEccNotSupported,
    InsufficientResources,
    FreqNotSupported,
    ArgumentVersionMismatch,
    Deprecated,
    NotReady,
    GpuNotFound,
    InvalidState,
    Unknown,
}

impl ErrorName {
    /// The code the real library returns for this error.
    pub fn code(self) -> Ret {
        use ErrorName::*;
        match self {
            Uninitialized => 1,
            InvalidArgument => 2,
            NotSupported => 3,
            NoPermission => 4,
            AlreadyInitialized => 5,
            NotFound => 6,
            InsufficientSize => 7,
            InsufficientPower => 8,
            DriverNotLoaded => 9,
            Timeout => 10,
            IrqIssue => 11,
            LibraryNotFound => 12,
            FunctionNotFound => 13,
            CorruptedInforom => 14,
            GpuIsLost => 15,
            ResetRequired => 16,
            OperatingSystem => 17,
            LibRmVersionMismatch => 18,
            InUse => 19,
            Memory => 20,
            NoData => 21,
            VgpuEccNotSupported => 22,
            InsufficientResources => 23,
            FreqNotSupported => 24,
            ArgumentVersionMismatch => 25,
            Deprecated => 26,
            NotReady => 27,
            GpuNotFound => 28,
            InvalidState => 29,
            Unknown => 999,
        }
    }
}

/// `nvmlErrorString`: static, NUL-terminated, valid for the life of the process.
pub fn error_string(code: Ret) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, because ECC is enabled",
        23 => c"Ran out of critical resources, other than memory",
        24 => c"The requested frequency is not supported",
        25 => c"The provided version is invalid/unsupported",
        26 => c"The requested functionality has been deprecated",
        27 => c"The system is not ready for the request",
        28 => c"The GPU was not found",
        29 => c"The resource is in an invalid state",
        _ => c"Unknown Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_nvml_h() {
        assert_eq!(ErrorName::GpuIsLost.code(), 15);
        assert_eq!(
            ErrorName::ArgumentVersionMismatch.code(),
            ARGUMENT_VERSION_MISMATCH
        );
        assert_eq!(ErrorName::Unknown.code(), UNKNOWN);
        assert_eq!(error_string(15).to_str().unwrap(), "GPU is lost");
    }
}
