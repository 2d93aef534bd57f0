//! The cluster's connection pool (each connection one to every master), the slot map it
//! keeps, and a WAIT routed to the master of one slot.

use std::collections::HashSet;

use parking_lot::Mutex;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionLike, RedisError, RedisResult, Value};

use crate::Result;
use crate::backend::bounds::Bounds;
use crate::backend::masters::Masters;
use crate::backend::replicas;
use crate::backend::request::Replicas;

/// A pool of cluster connections (each one a connection to every master).
pub(crate) struct ClusterPool {
    pool: r2d2::Pool<ClusterConnector>,
    pub(super) masters: Mutex<Masters>,
    /// Masters whose last call failed without an answer: asked last (see `per_master`).
    pub(super) suspects: Mutex<HashSet<String>>,
}

/// Makes cluster connections for the pool, and throws away those that failed mid-request.
struct ClusterConnector {
    client: ClusterClient,
}

struct Tracked {
    con: ClusterConnection,
    broken: bool,
}

impl r2d2::ManageConnection for ClusterConnector {
    type Connection = Tracked;
    type Error = RedisError;

    fn connect(&self) -> RedisResult<Tracked> {
        let con = self.client.get_connection()?;
        Ok(Tracked { con, broken: false })
    }

    fn is_valid(&self, tracked: &mut Tracked) -> RedisResult<()> {
        redis::cmd("PING").query(&mut tracked.con)
    }

    fn has_broken(&self, tracked: &mut Tracked) -> bool {
        tracked.broken || !tracked.con.is_open()
    }
}

impl ClusterPool {
    /// A pool of `size` connections to the cluster `client` points at, all made before
    /// this returns (so that unreachable seeds are reported here).
    pub(crate) fn build(client: ClusterClient, size: u32, bounds: Bounds) -> Result<ClusterPool> {
        let pool = r2d2::Pool::builder()
            .max_size(size)
            // A PING on every checkout would cost a round trip per lock operation.
            .test_on_check_out(false)
            .connection_timeout(bounds.checkout)
            .thread_pool(crate::backend::pool::worker())
            .build(ClusterConnector { client })?;
        let cluster = ClusterPool {
            pool,
            masters: Mutex::default(),
            suspects: Mutex::default(),
        };
        cluster.ask_for_masters();
        Ok(cluster)
    }

    /// Asks for the slot map again (best effort: a failure keeps the old one).
    pub(super) fn ask_for_masters(&self) {
        let reply = self.run(|con| redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(con));
        let mut masters = self.masters.lock();
        match reply {
            Ok(reply) => *masters = Masters::parse(&reply),
            Err(_) => masters.touched(),
        }
    }

    /// Runs one request on a pooled connection (it goes to the master of its keys' slot).
    /// A connection whose request failed other than by an error reply may be out of step
    /// with its replies: it is not used again.
    pub(crate) fn run<T>(
        &self,
        request: impl FnOnce(&mut ClusterConnection) -> RedisResult<T>,
    ) -> Result<T> {
        let mut tracked = self.pool.get()?;
        let result = request(&mut tracked.con);
        if let Err(e) = &result
            && e.code().is_none()
        {
            tracked.broken = true;
        }
        Ok(result?)
    }
}

/// `WAIT` on the master of `slot`, on the connection the slot's writes went over (the
/// cluster client would send a plain WAIT to every master and answer the least count).
/// Never on a connection made again meanwhile: a new one has no writes to wait for, and
/// WAIT would count every replica at once.
pub(crate) fn wait_on_slot(
    con: &mut ClusterConnection,
    slot: u16,
    replicas: Replicas,
) -> RedisResult<u32> {
    let master = Route::new(slot, SlotAddr::Master);
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(master));
    con.set_auto_reconnect(false);
    let acknowledged = con.route_command(&replicas::wait_cmd(replicas), route);
    con.set_auto_reconnect(true);
    Ok(redis::from_redis_value(acknowledged?)?)
}
