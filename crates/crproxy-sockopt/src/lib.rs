//! crproxy-sockopt: the socket option crproxy needs that std, tokio and socket2
//! do not offer, the receive low-water mark. The workspace forbids unsafe code;
//! the `setsockopt` call that sets the mark, and the `getsockopt` call that reads
//! it back (for the tests that check a mark is in place), live here, alone, so
//! that rule holds everywhere else.

use std::io;
use std::os::fd::BorrowedFd;

/// Sets the receive low-water mark (`SO_RCVLOWAT`): until that many bytes have
/// arrived, the socket does not poll readable. Linux only; elsewhere
/// [`io::ErrorKind::Unsupported`].
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn set_receive_low_water(socket: BorrowedFd<'_>, bytes: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value: libc::c_int = bytes;
    // SAFETY: the descriptor is borrowed, so it stays open for the whole call, and
    // the option value is a live `c_int` whose size is the length passed.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The receive low-water mark a socket has now (as the kernel capped it).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn receive_low_water(socket: BorrowedFd<'_>) -> io::Result<i32> {
    use std::os::fd::AsRawFd;
    let mut value: libc::c_int = 0;
    let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is borrowed, so it stays open for the whole call;
    // `value` and `length` are live and `length` is `value`'s size.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_mut(&mut value).cast(),
            &mut length,
        )
    };
    if result == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Elsewhere the mark does not hold back poll readiness the same way.
#[cfg(not(target_os = "linux"))]
pub fn set_receive_low_water(_socket: BorrowedFd<'_>, _bytes: i32) -> io::Result<()> {
    Err(linux_only())
}

#[cfg(not(target_os = "linux"))]
pub fn receive_low_water(_socket: BorrowedFd<'_>) -> io::Result<i32> {
    Err(linux_only())
}

#[cfg(not(target_os = "linux"))]
fn linux_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "the receive low-water mark is only used on Linux",
    )
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_mark_set_is_the_mark_read_back() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let socket =
            std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        assert_eq!(receive_low_water(socket.as_fd()).expect("read"), 1);
        set_receive_low_water(socket.as_fd(), 4096).expect("set");
        assert_eq!(receive_low_water(socket.as_fd()).expect("read"), 4096);
    }

    #[test]
    fn a_socket_that_is_not_one_is_refused_with_the_os_error() {
        // A pipe is a descriptor but no socket: the kernel's error comes back.
        let (reader, _writer) = std::io::pipe().expect("pipe");
        let error = set_receive_low_water(reader.as_fd(), 1).expect_err("not a socket");
        assert_eq!(error.raw_os_error(), Some(libc::ENOTSOCK));
    }
}
