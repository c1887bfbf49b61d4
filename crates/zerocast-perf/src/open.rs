//! Opening a test's data connection, through the blocking API or the
//! async one (`--async`: a current-thread tokio runtime per end, which
//! also runs the engines).

use std::rc::Rc;

use anyhow::Context as _;
use tokio::runtime::Runtime;
use zerocast::{ConnectError, Endpoint, Listener, Zerocast};

use crate::data::{config_for, DataPath};
use crate::spec::Spec;

/// Where a test's data connection comes from.
#[derive(Debug)]
pub(crate) enum Opener {
    Blocking(Zerocast),
    Async(Rc<Runtime>, zerocast::tokio::Zerocast),
}

impl Opener {
    pub(crate) fn for_spec(spec: &Spec) -> anyhow::Result<Self> {
        if !spec.async_api {
            return Ok(Opener::Blocking(Zerocast::with_config(config_for(spec))));
        }
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
        let zc = zerocast::tokio::Zerocast::with_runtime(config_for(spec), rt.handle().clone());
        Ok(Opener::Async(Rc::new(rt), zc))
    }

    pub(crate) fn listen(&self, uri: &str) -> Result<DataListener, ConnectError> {
        Ok(match self {
            Opener::Blocking(zc) => DataListener::Blocking(zc.listen(uri)?),
            Opener::Async(rt, zc) => DataListener::Async(rt.clone(), rt.block_on(zc.listen(uri))?),
        })
    }

    pub(crate) fn connect(&self, uri: &str, spec: &Spec) -> anyhow::Result<DataPath> {
        let failed = || format!("cannot open the data connection to {uri}");
        Ok(match self {
            Opener::Blocking(zc) => DataPath::new(zc.connect(uri).with_context(failed)?, spec),
            Opener::Async(rt, zc) => {
                DataPath::new_async(rt.clone(), rt.block_on(zc.connect(uri)).with_context(failed)?, spec)
            }
        })
    }
}

/// A test's listener for its data connection.
#[derive(Debug)]
pub(crate) enum DataListener {
    Blocking(Listener),
    Async(Rc<Runtime>, zerocast::tokio::Listener),
}

impl DataListener {
    pub(crate) fn local_endpoint(&self) -> &Endpoint {
        match self {
            DataListener::Blocking(l) => l.local_endpoint(),
            DataListener::Async(_, l) => l.local_endpoint(),
        }
    }

    pub(crate) fn accept(&self, spec: &Spec) -> anyhow::Result<DataPath> {
        Ok(match self {
            DataListener::Blocking(l) => DataPath::new(l.accept()?, spec),
            DataListener::Async(rt, l) => DataPath::new_async(rt.clone(), rt.block_on(l.accept())?, spec),
        })
    }
}
