//! c10d-gloo: under construction by the gloo helper.
