//! A loopback OTLP/HTTP trace receiver: it answers `POST /v1/traces` with
//! an empty `ExportTraceServiceResponse` and keeps every span it got,
//! decoded from the official `opentelemetry-proto` messages.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use prost::Message as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One span received, as the receiver decoded it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    /// Empty for a root span.
    pub parent_span_id: Vec<u8>,
    pub name: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// Every attribute, its value as text.
    pub attributes: Vec<(String, String)>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The receiver: what it got so far.
#[derive(Clone)]
pub struct OtlpReceiver {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    /// Requests it got (each `POST`, decoded or not).
    requests: Arc<Mutex<u64>>,
}

impl OtlpReceiver {
    /// Listens on 127.0.0.1 (any port) from now.
    pub async fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let r = OtlpReceiver {
            addr: listener.local_addr().expect("its address"),
            spans: Arc::default(),
            requests: Arc::default(),
        };
        let rx = r.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let rx = rx.clone();
                tokio::spawn(async move {
                    let _ = rx.serve(s).await;
                });
            }
        });
        r
    }

    /// The endpoint to give `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn requests(&self) -> u64 {
        self.requests.lock().map(|n| *n).unwrap_or(0)
    }

    /// Serves one connection, request after request.
    async fn serve(&self, s: TcpStream) -> std::io::Result<()> {
        let mut s = BufReader::new(s);
        loop {
            let mut line = String::new();
            if s.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let mut length = 0usize;
            loop {
                let mut h = String::new();
                if s.read_line(&mut h).await? == 0 {
                    return Ok(());
                }
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            s.read_exact(&mut body).await?;
            if let Ok(mut n) = self.requests.lock() {
                *n += 1;
            }
            if let Ok(req) = ExportTraceServiceRequest::decode(body.as_slice()) {
                self.keep(req);
            }
            s.get_mut()
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
                )
                .await?;
        }
    }

    fn keep(&self, req: ExportTraceServiceRequest) {
        let mut out = Vec::new();
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for sp in ss.spans {
                    out.push(ReceivedSpan {
                        service: service.clone(),
                        trace_id: sp.trace_id,
                        span_id: sp.span_id,
                        parent_span_id: sp.parent_span_id,
                        name: sp.name,
                        start_unix_nano: sp.start_time_unix_nano,
                        end_unix_nano: sp.end_time_unix_nano,
                        attributes: sp
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                            .collect(),
                    });
                }
            }
        }
        if let Ok(mut spans) = self.spans.lock() {
            spans.extend(out);
        }
    }
}

/// An attribute's value as text.
fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
