//! The one path that creates a group's backends and registers the group, shared by
//! `init_process_group`, `new_group`, `split_group` and `shrink_group`.

use super::registry::find_pg_by_ranks_and_tag;
use super::{GroupEntry, GroupMember, PgOptions, World};
use crate::config::{self, BackendConfig, BackendCreateArgs};
use crate::detail::DetailWrapper;
use c10d_core::{Backend, DebugLevel, Device, DeviceType, DistError, ProcessGroup, Result};
use c10d_store::{PrefixStore, Store};
use std::sync::Arc;
use std::time::Duration;

impl World {

    pub(crate) fn new_process_group_helper(
        &self,
        a: NewPg,
    ) -> Result<(GroupMember, Option<Arc<dyn Store>>)> {
        {
            let st = self.lock();
            if st.groups.iter().any(|e| e.pg.group_name() == a.group_name) {
                return Err(DistError::invalid(
                    "The specified group name has already been created, please use a different group name",
                ));
            }
            if let Some(tag) = a.pg_tag.as_deref().filter(|t| !t.is_empty()) {
                if let Some(pg) = find_pg_by_ranks_and_tag(&st, tag, &a.global_ranks) {
                    let store = st.entry(&pg).map(|e| e.store.clone());
                    return Ok((GroupMember::Group(pg), store));
                }
            }
        }
        let is_default = a.global_ranks.is_empty();
        if !is_default && a.group_rank.is_none() {
            return Ok((GroupMember::NonGroupMember, None));
        }
        let group_rank = a
            .group_rank
            .ok_or_else(|| DistError::invalid("Group rank must be specified for group members"))?;
        let prefix_store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            &format!("{}/", a.group_name),
            a.store.clone(),
        ));
        let pg = ProcessGroup::new(
            group_rank,
            a.group_size,
            a.group_name.clone(),
            a.group_desc.clone(),
            a.device_id,
        )?;
        let map = &a.config.device_backend_map;
        let distinct = a.config.backend_names();
        let mixed = distinct.len() > 1;
        let debug = self.get_debug_level()?;
        let hint = self.lock().hostname_hint.clone();
        let mut created: Vec<(String, Arc<dyn Backend>)> = Vec::new();
        for (device, bname) in map {
            let dt = DeviceType::parse(device)?;
            let backend = match created.iter().find(|(n, _)| n == bname) {
                Some((_, b)) if !mixed => b.clone(),
                _ => {
                    let (creator, extended) = config::creator_for(bname)?;
                    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
                        &format!("{device}/"),
                        prefix_store.clone(),
                    ));
                    let args = BackendCreateArgs {
                        store: store.clone(),
                        group_rank,
                        group_size: a.group_size,
                        timeout: a.timeout,
                        device: device.clone(),
                        group_name: if extended {
                            a.group_name.clone()
                        } else {
                            String::new()
                        },
                        group_desc: if extended {
                            a.group_desc.clone()
                        } else {
                            String::new()
                        },
                        global_ranks_in_group: if extended {
                            a.global_ranks.clone()
                        } else {
                            Vec::new()
                        },
                        pg_options: if extended {
                            a.pg_options
                                .as_ref()
                                .and_then(|o| o.backend_specific.clone())
                        } else {
                            None
                        },
                        hostname_hint: hint.clone(),
                    };
                    let Some(mut b) = creator(&args)? else {
                        return Ok((GroupMember::NonGroupMember, None));
                    };
                    if debug == DebugLevel::Detail {
                        b = self.wrap_detail(b, &args)?;
                    }
                    created.push((bname.clone(), b.clone()));
                    b
                }
            };
            pg.set_backend(dt, backend, false);
        }
        // Default device: the accelerator's for mixed configs, else the first device listed.
        let default_dt = if mixed && map.iter().any(|(d, _)| d == "cuda") {
            DeviceType::Cuda
        } else {
            map.first()
                .map(|(d, _)| DeviceType::parse(d))
                .transpose()?
                .unwrap_or(DeviceType::Cpu)
        };
        if let Ok(b) = pg.backend(default_dt) {
            pg.set_backend(default_dt, b, true);
        }
        let tag = match a.pg_tag.as_deref() {
            None | Some("") => None,
            Some(t) => Some(format!("user:{t}")),
        };
        let ranks = if is_default {
            (0..a.group_size).collect()
        } else {
            a.global_ranks.clone()
        };
        self.register_pg(
            GroupEntry {
                pg: pg.clone(),
                backend_name: a.backend.clone(),
                store: prefix_store.clone(),
                config: a.config.clone(),
                ranks,
                tag: String::new(),
                split_count: 0,
            },
            tag,
        )?;
        Ok((GroupMember::Group(pg), Some(prefix_store)))
    }

    pub(super) fn wrap_detail(
        &self,
        b: Arc<dyn Backend>,
        args: &BackendCreateArgs,
    ) -> Result<Arc<dyn Backend>> {
        let helper_name = self
            .settings()
            .detail_helper_backend
            .clone()
            .unwrap_or_else(|| "gloo".to_string());
        if !config::is_backend_available(&helper_name) {
            return Err(DistError::invalid(
                "ProcessGroupWrapper unsupported without GLOO backend.",
            ));
        }
        let (creator, _) = config::creator_for(&helper_name)?;
        let mut hargs = args.clone();
        // PyTorch: PrefixStore(f"pg_wrapper:{group_name}", backend store) for the helper group.
        let prefix = format!("pg_wrapper:{}", args.group_name);
        hargs.store = Arc::new(PrefixStore::new(&prefix, args.store.clone()));
        hargs.group_name = prefix;
        hargs.device = "cpu".into();
        let helper = creator(&hargs)?.ok_or_else(|| {
            DistError::invalid("ProcessGroupWrapper: helper backend creation returned no backend")
        })?;
        Ok(Arc::new(DetailWrapper::new(b, helper)))
    }

}

pub(crate) struct NewPg {
    pub(crate) group_size: usize,
    pub(crate) group_rank: Option<usize>,
    pub(crate) global_ranks: Vec<usize>,
    pub(crate) backend: String,
    pub(crate) config: BackendConfig,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) group_name: String,
    pub(crate) pg_options: Option<PgOptions>,
    pub(crate) timeout: Duration,
    pub(crate) pg_tag: Option<String>,
    pub(crate) device_id: Option<Device>,
    pub(crate) group_desc: String,
}
