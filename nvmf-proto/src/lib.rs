//! NVMe/TCP wire protocol, sans-IO.
