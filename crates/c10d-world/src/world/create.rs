//! The one path that creates a group's backends and registers the group, shared by
//! `init_process_group`, `new_group`, `split_group` and `shrink_group`
//! (`_new_process_group_helper`).
//!
//! Steps: the name must be free (or a tagged group with the same ranks is returned as is), ranks
//! outside the group get [`GroupMember::NonGroupMember`], the group's store is
//! `PrefixStore("<name>/", store)`, the backends come from a [`BackendSource`] (the registered
//! creators, one per distinct backend name, each over `PrefixStore("<device>/", group store)`, or
//! the child a parent backend split off), DETAIL mode wraps each in a [`DetailWrapper`], and the
//! group is registered in the world's maps.

use super::registry::find_pg_by_ranks_and_tag;
use super::{GroupEntry, GroupMember, PgOptions, World};
use crate::config::{self, BackendConfig, BackendCreateArgs};
use crate::detail::DetailWrapper;
use c10d_core::{
    Backend, BackendOptions, DebugLevel, Device, DeviceType, DistError, ProcessGroup, Result,
};
use c10d_store::{PrefixStore, Store};
use std::sync::Arc;
use std::time::Duration;

/// Where a new group's backends come from.
pub(crate) enum BackendSource {
    /// The registered creators, one backend per distinct backend name of the config (one per
    /// device for mixed configs).
    Create,
    /// The child the parent's backend split off ([`Backend::split`]); it serves every device of
    /// the config and is the default for its own device type.
    Split(Arc<dyn Backend>),
    /// The backend the parent's own backend shrank off ([`Backend::shrink`], `ncclCommShrink`)
    /// for its device type; the other devices' backends are created as for `Create`.
    Shrunk(Arc<dyn Backend>),
}

/// `set_backend` calls to make on the new group, in order: (device type, backend, make default).
type Attachments = Vec<(DeviceType, Arc<dyn Backend>, bool)>;

/// A created group: the group (or the non-member sentinel) and its prefix store.
type Created = (GroupMember, Option<Arc<dyn Store>>);

impl World {
    /// `_new_process_group_helper`: creates the group's backends with the registered creators.
    ///
    /// # Errors
    /// "The specified group name has already been created, please use a different group name";
    /// "Group rank must be specified for group members"; backend creation errors.
    pub(crate) fn new_process_group_helper(&self, a: NewPg) -> Result<Created> {
        self.create_group(a, BackendSource::Create)
    }

    /// The shared creation path: see the module docs.
    ///
    /// # Errors
    /// As [`World::new_process_group_helper`].
    pub(crate) fn create_group(&self, a: NewPg, source: BackendSource) -> Result<Created> {
        if let Some(existing) = self.existing_group(&a)? {
            return Ok(existing);
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
        let attachments = match source {
            BackendSource::Create => {
                match self.create_backends(&a, group_rank, &prefix_store, None)? {
                    Some(list) => list,
                    None => return Ok((GroupMember::NonGroupMember, None)),
                }
            }
            BackendSource::Shrunk(b) => {
                match self.create_backends(&a, group_rank, &prefix_store, Some(&b))? {
                    Some(list) => list,
                    None => return Ok((GroupMember::NonGroupMember, None)),
                }
            }
            BackendSource::Split(child) => self.split_backends(&a, child, &prefix_store)?,
        };
        for (dt, backend, make_default) in attachments {
            pg.set_backend(dt, backend, make_default);
        }
        self.register_created(&a, &pg, &prefix_store)?;
        Ok((GroupMember::Group(pg), Some(prefix_store)))
    }

    /// The name must be free; a tagged group of the same ranks is returned instead of a new one.
    fn existing_group(&self, a: &NewPg) -> Result<Option<Created>> {
        let st = self.lock();
        if st.groups.iter().any(|e| e.pg.group_name() == a.group_name) {
            return Err(DistError::invalid(
                "The specified group name has already been created, please use a different group name",
            ));
        }
        if let Some(tag) = a.pg_tag.as_deref().filter(|t| !t.is_empty()) {
            if let Some(pg) = find_pg_by_ranks_and_tag(&st, tag, &a.global_ranks) {
                let store = st.entry(&pg).map(|e| e.store.clone());
                return Ok(Some((GroupMember::Group(pg), store)));
            }
        }
        Ok(None)
    }

    /// One backend per distinct name of the config (per device when mixed), made by the
    /// registered creators (`premade` serves its own device type instead); `None` when a
    /// creator says this rank is not a member.
    fn create_backends(
        &self,
        a: &NewPg,
        group_rank: usize,
        prefix_store: &Arc<dyn Store>,
        premade: Option<&Arc<dyn Backend>>,
    ) -> Result<Option<Attachments>> {
        let map = &a.config.device_backend_map;
        let mixed = a.config.backend_names().len() > 1;
        let debug = self.get_debug_level()?;
        let hint = self.lock().hostname_hint.clone();
        let mut created: Vec<(String, Arc<dyn Backend>)> = Vec::new();
        let mut out: Attachments = Vec::new();
        for &(dt, ref bname) in map {
            if let Some(p) = premade.filter(|p| p.device_type() == dt) {
                out.push((dt, p.clone(), false));
                continue;
            }
            let backend = match created.iter().find(|(n, _)| n == bname) {
                Some((_, b)) if !mixed => b.clone(),
                _ => {
                    let (creator, extended) = config::creator_for(bname)?;
                    let args = backend_args(a, dt, group_rank, prefix_store, extended, &hint);
                    let Some(b) = creator(&args)? else {
                        return Ok(None);
                    };
                    let b = self.wrap_if_detail(b, &args, debug)?;
                    created.push((bname.clone(), b.clone()));
                    b
                }
            };
            out.push((dt, backend, false));
        }
        // Default device: the accelerator's for mixed configs, else the first device listed.
        let default_dt = if mixed && map.iter().any(|(d, _)| *d == DeviceType::Cuda) {
            DeviceType::Cuda
        } else {
            map.first().map_or(DeviceType::Cpu, |(d, _)| *d)
        };
        if let Some((_, b, _)) = out.iter().rev().find(|(d, _, _)| *d == default_dt) {
            out.push((default_dt, b.clone(), true));
        }
        Ok(Some(out))
    }

    /// The split-off child (wrapped in DETAIL mode): the default for its own device type and the
    /// backend of every other device of the config.
    fn split_backends(
        &self,
        a: &NewPg,
        child: Arc<dyn Backend>,
        prefix_store: &Arc<dyn Store>,
    ) -> Result<Attachments> {
        let debug = self.get_debug_level()?;
        let child_dt = child.device_type();
        let child = if debug == DebugLevel::Detail {
            let hint = self.lock().hostname_hint.clone();
            let mut args = backend_args(a, child_dt, child.rank(), prefix_store, true, &hint);
            args.pg_options = None;
            self.wrap_detail(child, &args)?
        } else {
            child
        };
        let mut out: Attachments = vec![(child_dt, child.clone(), true)];
        for &(dt, _) in &a.config.device_backend_map {
            if dt != child_dt {
                out.push((dt, child.clone(), false));
            }
        }
        Ok(out)
    }

    /// Registers a created group: tag "user:<tag>" when one was given, WORLD's ranks `0..size`.
    fn register_created(
        &self,
        a: &NewPg,
        pg: &ProcessGroup,
        prefix_store: &Arc<dyn Store>,
    ) -> Result<()> {
        let tag = match a.pg_tag.as_deref() {
            None | Some("") => None,
            Some(t) => Some(format!("user:{t}")),
        };
        let ranks = if a.global_ranks.is_empty() {
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
        )
    }

    /// `b` wrapped for `TORCH_DISTRIBUTED_DEBUG=DETAIL`, as is otherwise.
    fn wrap_if_detail(
        &self,
        b: Arc<dyn Backend>,
        args: &BackendCreateArgs,
        debug: DebugLevel,
    ) -> Result<Arc<dyn Backend>> {
        if debug == DebugLevel::Detail {
            self.wrap_detail(b, args)
        } else {
            Ok(b)
        }
    }

    /// `ProcessGroupWrapper`: `b` checked against a helper group of the DETAIL helper backend
    /// (default gloo) over `PrefixStore("pg_wrapper:<group name>", backend store)`.
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
        hargs.device = DeviceType::Cpu;
        let helper = creator(&hargs)?.ok_or_else(|| {
            DistError::invalid("ProcessGroupWrapper: helper backend creation returned no backend")
        })?;
        Ok(Arc::new(DetailWrapper::new(b, helper)))
    }
}

/// A creator's arguments for one device: store `PrefixStore("<device>/", group store)`; name,
/// description, global ranks and backend-specific options only for extended-API creators.
fn backend_args(
    a: &NewPg,
    device: DeviceType,
    group_rank: usize,
    prefix_store: &Arc<dyn Store>,
    extended: bool,
    hint: &Option<String>,
) -> BackendCreateArgs {
    BackendCreateArgs {
        store: Arc::new(PrefixStore::new(
            &format!("{}/", device.as_str()),
            prefix_store.clone(),
        )),
        group_rank,
        group_size: a.group_size,
        timeout: a.timeout,
        device,
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
        device_id: a.device_id,
    }
}

/// What a new group is made of (`_new_process_group_helper`'s arguments). An empty
/// `global_ranks` means the default group (ranks `0..group_size`); `group_rank: None` a rank
/// outside the group.
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

impl NewPg {
    /// The core [`BackendOptions`] of the group (what a parent's backend needs to split or
    /// shrink itself into it).
    pub(crate) fn backend_options(&self) -> BackendOptions {
        BackendOptions {
            backend: self.backend.clone(),
            timeout: self.timeout,
            group_name: self.group_name.clone(),
            group_desc: self.group_desc.clone(),
            global_ranks: self.global_ranks.clone(),
        }
    }
}
