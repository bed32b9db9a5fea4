//! What a guest writes to stdout and stderr, kept in memory per delivery and forwarded to
//! tracing afterwards. Like wasmtime-wasi's `MemoryOutputPipe` (same capacity rule: a write
//! past it fails, a full pipe reads as closed), plus [`Capture::take`]: an instance reused
//! for another delivery starts with empty pipes, so one delivery's output is never reported
//! with the next one's and each delivery has the whole capacity.

use bytes::{Bytes, BytesMut};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// One guest output stream (stdout or stderr) of an instance. Clones share the buffer: the
/// WASI context writes through one, the host takes what was written through another.
#[derive(Debug, Clone)]
pub(super) struct Capture {
    /// Bytes one delivery may write.
    capacity: usize,
    buffer: Arc<Mutex<BytesMut>>,
}

impl Capture {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            buffer: Arc::new(Mutex::new(BytesMut::new())),
        }
    }

    fn buffer(&self) -> MutexGuard<'_, BytesMut> {
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What was written since the last take; the pipe is empty afterwards.
    pub(super) fn take(&self) -> Bytes {
        self.buffer().split().freeze()
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let mut buffer = self.buffer();
        if bytes.len() > self.capacity.saturating_sub(buffer.len()) {
            return Err(StreamError::trap(
                "write beyond the captured output's capacity",
            ));
        }
        buffer.extend_from_slice(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let used = self.buffer().len();
        if used < self.capacity {
            Ok(self.capacity - used)
        } else {
            // Full: nothing more will be taken during this delivery.
            Err(StreamError::Closed)
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut buffer = self.buffer();
        let taken = buf.len().min(self.capacity.saturating_sub(buffer.len()));
        buffer.extend_from_slice(&buf[..taken]);
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_take_empties_the_pipe_and_restores_the_whole_capacity() {
        let capture = Capture::new(8);
        let mut stream = capture.clone();
        stream.write(Bytes::from_static(b"12345")).expect("fits");
        assert_eq!(stream.check_write().expect("room"), 3);
        assert!(
            stream.write(Bytes::from_static(b"6789")).is_err(),
            "past capacity"
        );
        assert_eq!(&capture.take()[..], b"12345");
        assert!(capture.take().is_empty(), "taken once");
        assert_eq!(
            stream.check_write().expect("room"),
            8,
            "a delivery gets it all"
        );
        stream.write(Bytes::from_static(b"12345678")).expect("fits");
        assert!(matches!(stream.check_write(), Err(StreamError::Closed)));
    }
}
