//! A telemetry websocket client for tests: checks every frame's envelope (version 1, gap-free
//! `seq`) and waits for the frame a test is after, bounded.

use std::time::Duration;

use bch_core::telemetry::{ServerFrame, ServerMessage};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct Client {
    pub socket: Socket,
    next_seq: u64,
    /// The protocol version every frame must carry.
    version: u32,
}

impl Client {
    /// A client that asks for no version: it gets version 1, as every older console does.
    pub async fn connect(gateway: &gatewayd::RunningGateway) -> Client {
        Client::connect_to(gateway, "/ws", 1).await
    }

    /// A client of `path` (with its query) whose frames must all carry version `version`.
    pub async fn connect_to(
        gateway: &gatewayd::RunningGateway,
        path: &str,
        version: u32,
    ) -> Client {
        let (socket, _) =
            tokio_tungstenite::connect_async(format!("ws://{}{path}", gateway.control_addr))
                .await
                .expect("websocket upgrade");
        Client {
            socket,
            next_seq: 0,
            version,
        }
    }

    /// A client of `/ws?v=VERSION` that presents `token` as its bearer token.
    pub async fn connect_with_token(
        gateway: &gatewayd::RunningGateway,
        version: u32,
        token: &str,
    ) -> Client {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = format!("ws://{}/ws?v={version}", gateway.control_addr);
        let mut request = url.into_client_request().unwrap();
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .expect("websocket upgrade");
        Client {
            socket,
            next_seq: 0,
            version,
        }
    }

    /// Next frame, checking the envelope: the client's version and a gap-free `seq`.
    pub async fn frame(&mut self) -> ServerFrame {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(5), self.socket.next())
                .await
                .expect("a frame within 5 s")
                .expect("socket open")
                .expect("valid frame");
            let Message::Text(text) = message else {
                continue;
            };
            let frame: ServerFrame = serde_json::from_str(&text).expect("frame parses");
            assert_eq!(frame.v, self.version);
            assert_eq!(frame.seq, self.next_seq, "seq without gaps");
            self.next_seq += 1;
            return frame;
        }
    }

    /// Reads frames until `pick` returns something.
    pub async fn until<T>(&mut self, mut pick: impl FnMut(&ServerMessage) -> Option<T>) -> T {
        for _ in 0..5_000 {
            let frame = self.frame().await;
            if let Some(found) = pick(&frame.message) {
                return found;
            }
        }
        panic!("condition not seen in 5,000 frames");
    }

    /// The next `policy` frame.
    pub async fn next_policy(&mut self) -> bch_core::telemetry::PolicyUpdate {
        self.until(|m| match m {
            ServerMessage::Policy(p) => Some(p.clone()),
            _ => None,
        })
        .await
    }

    /// The next `ack` frame: a command of this client's was applied.
    pub async fn next_ack(&mut self) -> bch_core::telemetry::Ack {
        self.until(|m| match m {
            ServerMessage::Ack(ack) => Some(ack.clone()),
            _ => None,
        })
        .await
    }

    /// The next `error` frame: a command of this client's was refused.
    pub async fn next_error(&mut self) -> bch_core::telemetry::CommandError {
        self.until(|m| match m {
            ServerMessage::Error(e) => Some(e.clone()),
            _ => None,
        })
        .await
    }

    pub async fn send(&mut self, json: serde_json::Value) {
        self.socket
            .send(Message::Text(json.to_string().into()))
            .await
            .unwrap();
    }
}
