use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// How long a socket that should stay unreadable is watched.
const QUIET: Duration = Duration::from_millis(150);
/// How long a socket that should turn readable may take.
const PROMPT: Duration = Duration::from_secs(5);

/// A client and the server's end of its connection, the server's read to empty
/// as a reader that rests would have left it: tokio takes a new socket to be
/// readable until a read says otherwise.
async fn connected_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
    let (server, _) = accepted.expect("accept");
    let mut buffer = [0u8; 16];
    let drained = server.try_read(&mut buffer);
    assert!(
        matches!(&drained, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing sent yet: {drained:?}"
    );
    (client.expect("connect"), server)
}

fn resting(stream: &TcpStream) -> RestingSocket {
    RestingSocket::new(Arc::new(
        stream.as_fd().try_clone_to_owned().expect("duplicate"),
    ))
}

async fn read_some(stream: &mut TcpStream) -> Vec<u8> {
    let mut buffer = vec![0u8; 64];
    let read = tokio::time::timeout(PROMPT, stream.read(&mut buffer))
        .await
        .expect("readable in time")
        .expect("read");
    buffer.truncate(read);
    buffer
}

/// Lets `socket` rest, sends "an event" from `client`, and checks that the
/// server's end stays unreadable: one small arrival is below the mark.
async fn an_event_wakes_nobody(
    socket: &mut RestingSocket,
    client: &mut TcpStream,
    server: &TcpStream,
) {
    socket.rest();
    client.write_all(b"an event").await.expect("write");
    assert!(
        tokio::time::timeout(QUIET, server.readable())
            .await
            .is_err(),
        "a resting socket is not readable below the mark"
    );
}

#[tokio::test]
async fn arrivals_while_resting_wake_nobody_until_the_socket_wakes() {
    let (mut client, mut server) = connected_pair().await;
    let mut socket = resting(&server);
    an_event_wakes_nobody(&mut socket, &mut client, &server).await;
    socket.wake();
    assert_eq!(read_some(&mut server).await, b"an event");
}

#[tokio::test]
async fn a_resting_socket_wakes_once_the_threshold_has_gathered() {
    let (mut client, server) = connected_pair().await;
    let mut socket = resting(&server);
    an_event_wakes_nobody(&mut socket, &mut client, &server).await;
    // The kernel caps the mark below REST_THRESHOLD; the writer sends until the
    // socket turns readable, whatever the cap is here.
    let burst = vec![b'x'; REST_THRESHOLD as usize + 1];
    let writer = tokio::spawn(async move { client.write_all(&burst).await });
    tokio::time::timeout(PROMPT, server.readable())
        .await
        .expect("readable once the mark is reached")
        .expect("readiness");
    writer.abort();
}

#[tokio::test]
async fn dropping_a_resting_socket_wakes_it() {
    let (mut client, mut server) = connected_pair().await;
    let mut socket = resting(&server);
    socket.rest();
    client.write_all(b"left behind").await.expect("write");
    drop(socket);
    assert_eq!(read_some(&mut server).await, b"left behind");
}

#[tokio::test]
async fn resting_raises_the_mark_and_waking_restores_it() {
    let (_client, server) = connected_pair().await;
    let mark = || crproxy_sockopt::receive_low_water(server.as_fd()).expect("mark");
    let mut socket = resting(&server);
    socket.rest();
    assert!(mark() > 1, "resting: {}", mark());
    socket.wake();
    assert_eq!(mark(), 1);
    socket.wake();
    assert_eq!(mark(), 1, "waking twice changes nothing");
}

#[tokio::test]
async fn a_socket_that_never_rested_reads_as_usual() {
    let (mut client, mut server) = connected_pair().await;
    let mut socket = resting(&server);
    socket.wake();
    client.write_all(b"plain").await.expect("write");
    assert_eq!(read_some(&mut server).await, b"plain");
}

#[test]
fn a_socket_that_cannot_rest_is_read_as_it_comes() {
    // A pipe is a descriptor but no socket: raising its mark fails.
    let (reader, _writer) = std::io::pipe().expect("pipe");
    let mut socket = RestingSocket::new(Arc::new(OwnedFd::from(reader)));
    socket.rest();
    assert_eq!(socket.state, Rest::Unable);
    socket.wake();
    assert_eq!(socket.state, Rest::Unable);
}

#[tokio::test]
async fn once_unable_to_rest_a_socket_is_not_asked_again() {
    let (_client, server) = connected_pair().await;
    let mut socket = resting(&server);
    socket.state = Rest::Unable;
    socket.rest();
    let mark = crproxy_sockopt::receive_low_water(server.as_fd()).expect("mark");
    assert_eq!(mark, 1, "the mark of a socket given up on stays as it was");
}
