//! [`UnitManager`] over the system bus (`org.freedesktop.systemd1`, typed proxies from
//! zbus_systemd). Jobs are awaited through the manager's `JobRemoved` signal, subscribed to
//! before the job is queued so no result is missed (see org.freedesktop.systemd1(5)).

use super::{JOB_TIMEOUT, RESTART_GRACE, SystemdError, UnitManager, UnitState, service_outcome};
use futures::{Stream, StreamExt};
use zbus_systemd::systemd1::{ManagerProxy, ServiceProxy, UnitProxy};
use zbus_systemd::zbus;

/// A connection to the service manager.
#[derive(Clone)]
pub struct SystemdManager {
    conn: zbus::Connection,
    manager: ManagerProxy<'static>,
}

fn bus(call: &'static str, unit: &str) -> impl FnOnce(zbus::Error) -> SystemdError {
    let unit = unit.to_string();
    move |e| SystemdError::Bus {
        call,
        unit,
        message: e.to_string(),
    }
}

impl SystemdManager {
    /// Connects to the system bus and subscribes to the manager's signals.
    ///
    /// # Errors
    /// [`SystemdError::Bus`] if the system bus is not reachable (is dbus running?).
    pub async fn connect() -> Result<Self, SystemdError> {
        let conn = zbus::Connection::system()
            .await
            .map_err(bus("connect to the system bus", "-"))?;
        let manager = ManagerProxy::new(&conn)
            .await
            .map_err(bus("Manager", "-"))?;
        manager.subscribe().await.map_err(bus("Subscribe", "-"))?;
        Ok(SystemdManager { conn, manager })
    }

    /// A proxy for `unit` (loaded if needed). `cached` keeps a property cache that the unit's
    /// PropertiesChanged signals update — required for the `receive_*_changed` streams; without
    /// it every property read is a fresh D-Bus call.
    async fn unit_proxy(
        &self,
        unit: &str,
        cached: bool,
    ) -> Result<UnitProxy<'static>, SystemdError> {
        let path = self
            .manager
            .load_unit(unit.to_string())
            .await
            .map_err(bus("LoadUnit", unit))?;
        let cache = if cached {
            zbus::proxy::CacheProperties::Yes
        } else {
            zbus::proxy::CacheProperties::No
        };
        UnitProxy::builder(&self.conn)
            .path(path)
            .cache_properties(cache)
            .build()
            .await
            .map_err(bus("Unit", unit))
    }

    async fn run_job<F>(&self, job: &'static str, unit: &str, queue: F) -> Result<(), SystemdError>
    where
        F: std::future::Future<Output = zbus::Result<zbus::OwnedObjectPath>>,
    {
        let mut removed = self
            .manager
            .receive_job_removed()
            .await
            .map_err(bus("JobRemoved", unit))?;
        let path = queue.await.map_err(bus(job, unit))?;
        let wait = async {
            while let Some(signal) = removed.next().await {
                let Ok(args) = signal.args() else { continue };
                if *args.job == *path {
                    return Some(args.result.to_string());
                }
            }
            None
        };
        match tokio::time::timeout(JOB_TIMEOUT, wait).await {
            Ok(Some(result)) if result == "done" => Ok(()),
            Ok(Some(result)) => {
                let detail = self.outcome(unit).await;
                if job != "stop" && self.comes_back(unit).await {
                    tracing::warn!(%unit, %job, %result, %detail, "the unit failed to start, and systemd restarted it (its Restart= setting): it is active now");
                    return Ok(());
                }
                Err(SystemdError::JobFailed {
                    job,
                    unit: unit.into(),
                    result,
                    detail,
                })
            }
            Ok(None) => Err(SystemdError::Bus {
                call: "JobRemoved",
                unit: unit.into(),
                message: "signal stream ended".into(),
            }),
            Err(_) => Err(SystemdError::JobTimedOut {
                job,
                unit: unit.into(),
                timeout: JOB_TIMEOUT,
            }),
        }
    }

    /// After a failed start: whether systemd restarts `unit` by itself (its `Restart=`, e.g.
    /// containerd's `Restart=always`) and it becomes active within [`RESTART_GRACE`]
    /// ([`UnitState::settled`]). A unit that is not restarting, or fails for good (its start
    /// limit), is `false` at once.
    async fn comes_back(&self, unit: &str) -> bool {
        let Ok(states) = self.watch(unit).await else {
            return false;
        };
        let mut states = std::pin::pin!(states);
        let wait = async {
            while let Some(state) = states.next().await {
                if let Some(active) = state.settled() {
                    return active;
                }
            }
            false
        };
        tokio::time::timeout(RESTART_GRACE, wait)
            .await
            .unwrap_or(false)
    }

    /// How service `unit`'s last run ended ([`service_outcome`]); empty for other unit types
    /// or when the properties cannot be read (the job's result is reported anyway).
    async fn outcome(&self, unit: &str) -> String {
        if !unit.ends_with(".service") {
            return String::new();
        }
        let read = async {
            let path = self.manager.load_unit(unit.to_string()).await?;
            let service = ServiceProxy::builder(&self.conn)
                .path(path)
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await?;
            let result: String = service.result().await?;
            let code = service.exec_main_code().await?;
            let status = service.exec_main_status().await?;
            Ok::<_, zbus::Error>(service_outcome(&result, code, status))
        };
        read.await.unwrap_or_default()
    }

    /// A stream that yields the unit's state now and after every change of its `ActiveState`
    /// or `SubState` (PropertiesChanged signals), for reporting conditions.
    ///
    /// # Errors
    /// [`SystemdError::Bus`] if the unit cannot be loaded or watched.
    pub async fn watch(
        &self,
        unit: &str,
    ) -> Result<impl Stream<Item = UnitState> + Send + 'static, SystemdError> {
        // Signals come through a caching proxy; states are read through an uncached one, since
        // the cache never refreshes `LoadState` (a "const" property) after a daemon-reload.
        let signals = self.unit_proxy(unit, true).await?;
        let reader = self.unit_proxy(unit, false).await?;
        let active = signals.receive_active_state_changed().await.map(|_| ());
        let sub = signals.receive_sub_state_changed().await.map(|_| ());
        let changes = futures::stream::select(active, sub);
        let first = futures::stream::once(async {});
        Ok(first.chain(changes).then(move |()| {
            let _keep_subscribed = &signals;
            let reader = reader.clone();
            async move {
                read_state(&reader).await.unwrap_or_else(|_| UnitState {
                    load_state: "unknown".into(),
                    active_state: "unknown".into(),
                    sub_state: "unknown".into(),
                })
            }
        }))
    }
}

async fn read_state(proxy: &UnitProxy<'_>) -> zbus::Result<UnitState> {
    Ok(UnitState {
        load_state: proxy.load_state().await?,
        active_state: proxy.active_state().await?,
        sub_state: proxy.sub_state().await?,
    })
}

impl UnitManager for SystemdManager {
    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        self.manager.reload().await.map_err(bus("Reload", "-"))
    }

    async fn enable(&self, units: &[&str]) -> Result<(), SystemdError> {
        let names: Vec<String> = units.iter().map(|u| u.to_string()).collect();
        self.manager
            .enable_unit_files(names.clone(), false, true)
            .await
            .map_err(bus("EnableUnitFiles", &names.join(" ")))?;
        Ok(())
    }

    async fn disable(&self, units: &[&str]) -> Result<(), SystemdError> {
        let names: Vec<String> = units.iter().map(|u| u.to_string()).collect();
        self.manager
            .disable_unit_files(names.clone(), false)
            .await
            .map_err(bus("DisableUnitFiles", &names.join(" ")))?;
        Ok(())
    }

    async fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.run_job(
            "start",
            unit,
            self.manager.start_unit(unit.into(), "replace".into()),
        )
        .await
    }

    async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.run_job(
            "stop",
            unit,
            self.manager.stop_unit(unit.into(), "replace".into()),
        )
        .await
    }

    async fn restart(&self, unit: &str) -> Result<(), SystemdError> {
        self.run_job(
            "restart",
            unit,
            self.manager.restart_unit(unit.into(), "replace".into()),
        )
        .await
    }

    async fn reboot(&self) -> Result<(), SystemdError> {
        self.manager
            .start_unit("reboot.target".into(), "replace-irreversibly".into())
            .await
            .map(|_| ())
            .map_err(bus("reboot", "reboot.target"))
    }

    async fn state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        let proxy = self.unit_proxy(unit, false).await?;
        read_state(&proxy)
            .await
            .map_err(bus("Get unit properties", unit))
    }
}
