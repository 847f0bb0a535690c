//! The gateway's listening sockets: bound once at start, before anything is built, so a worker
//! URL that leads back to one of them is refused with the addresses they really got (port 0
//! included), and the accept loops get them with the limits and timeouts they serve under.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use super::options::StartError;
use crate::config::Config;

/// The listeners, bound, with the addresses they got: the data plane's (unless it is off), the
/// control plane's, and the endpoint picker's (when configured).
pub(super) struct Listeners {
    pub(super) data: Option<TcpListener>,
    pub(super) control: TcpListener,
    pub(super) picker: Option<(TcpListener, SocketAddr)>,
    pub(super) data_addr: SocketAddr,
    pub(super) control_addr: SocketAddr,
    pub(super) header_read_timeout: Duration,
    pub(super) max_connections: usize,
    pub(super) client_stall_timeout: Duration,
    pub(super) upstream_idle_timeout: Duration,
}

impl Listeners {
    pub(super) async fn bind(config: &Config) -> Result<Self, StartError> {
        let (data, data_addr) = if config.server.listeners.data_plane {
            let data = bind("data", config.server.listeners.listen).await?;
            let addr = local_addr("data", &data, config.server.listeners.listen)?;
            (Some(data), addr)
        } else {
            (None, SocketAddr::from(([0, 0, 0, 0], 0)))
        };
        let control = bind("control", config.server.listeners.control_listen).await?;
        let picker = match config.picker.listen {
            Some(address) => {
                let picker = bind("picker", address).await?;
                let addr = local_addr("picker", &picker, address)?;
                Some((picker, addr))
            }
            None => None,
        };
        Ok(Self {
            control_addr: local_addr("control", &control, config.server.listeners.control_listen)?,
            data,
            control,
            picker,
            data_addr,
            header_read_timeout: config.server.timeouts.header_read,
            max_connections: config.server.limits.max_connections,
            client_stall_timeout: config.server.timeouts.client_stall,
            upstream_idle_timeout: config.server.timeouts.upstream_idle,
        })
    }

    /// The addresses this gateway serves on (the data plane's only when it runs): a worker URL
    /// that is one of them would send requests back here.
    pub(super) fn own_addresses(&self) -> Vec<SocketAddr> {
        let data = self.data.is_some().then_some(self.data_addr);
        let picker = self.picker.as_ref().map(|(_, addr)| *addr);
        data.into_iter()
            .chain([self.control_addr])
            .chain(picker)
            .collect()
    }
}

async fn bind(plane: &'static str, address: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(address)
        .await
        .map_err(|cause| StartError::Bind {
            plane,
            address,
            cause,
        })
}

fn local_addr(
    plane: &'static str,
    listener: &TcpListener,
    address: SocketAddr,
) -> Result<SocketAddr, StartError> {
    listener.local_addr().map_err(|cause| StartError::Bind {
        plane,
        address,
        cause,
    })
}
