//! Raw-wire helpers of the TcpStore server tests, written from the protocol's bytes rather than
//! the client's code so that they check the wire format independently.

use std::io::Read;
use std::net::TcpStream;

/// A client's handshake: `VALIDATE` with PyTorch's magic `0x3C85F7CE`, then `PING` with 1
/// (answered by the server with 1 as a u32).
pub const HELLO: [u8; 10] = [0x00, 0xce, 0xf7, 0x85, 0x3c, 0x0d, 1, 0, 0, 0];

/// True when the server closed the connection (EOF or reset) within the read timeout.
pub fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}
