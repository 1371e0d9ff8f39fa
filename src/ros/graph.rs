//! The subscriptions of a topic, for the output QoS check: r2r 0.9.7 wraps
//! `rcl_get_publishers_info_by_topic` but not `rcl_get_subscriptions_info_by_topic`, and keeps its
//! node handle private, so this is a second rcl node on its own context that only queries the
//! graph (it creates no endpoints). It is named `<node>_graph`.

use std::ffi::{CStr, CString};

use r2r::QosProfile;
use r2r_rcl::*;

pub struct GraphProbe {
    init_options: Box<rcl_init_options_t>,
    context: Box<rcl_context_t>,
    node: Box<rcl_node_t>,
}

// Owned and used by one thread at a time (the node's spin thread).
unsafe impl Send for GraphProbe {}

fn check(what: &str, ret: rcl_ret_t) -> Result<(), String> {
    if ret == RCL_RET_OK as rcl_ret_t {
        return Ok(());
    }
    // SAFETY: rcutils keeps a thread-local error string; reading and resetting it is always valid.
    let msg = unsafe {
        let text = CStr::from_ptr(rcutils_get_error_string().str_.as_ptr()).to_string_lossy().into_owned();
        rcutils_reset_error();
        text
    };
    Err(format!("{what} failed ({ret}): {msg}"))
}

impl GraphProbe {
    pub fn new(name: &str) -> Result<Self, String> {
        let cname = CString::new(name).map_err(|e| e.to_string())?;
        let cns = CString::new("/").expect("no NUL");
        // SAFETY: the usual rcl init sequence on zero-initialized structs that this value owns.
        unsafe {
            let mut init_options = Box::new(rcl_get_zero_initialized_init_options());
            check(
                "rcl_init_options_init",
                rcl_init_options_init(init_options.as_mut(), rcutils_get_default_allocator()),
            )?;
            let mut context = Box::new(rcl_get_zero_initialized_context());
            if let Err(e) = check("rcl_init", rcl_init(0, std::ptr::null(), init_options.as_ref(), context.as_mut())) {
                rcl_init_options_fini(init_options.as_mut());
                return Err(e);
            }
            let mut node = Box::new(rcl_get_zero_initialized_node());
            let node_options = rcl_node_get_default_options();
            let ret = rcl_node_init(node.as_mut(), cname.as_ptr(), cns.as_ptr(), context.as_mut(), &node_options);
            if let Err(e) = check("rcl_node_init", ret) {
                rcl_shutdown(context.as_mut());
                rcl_context_fini(context.as_mut());
                rcl_init_options_fini(init_options.as_mut());
                return Err(e);
            }
            Ok(Self { init_options, context, node })
        }
    }

    /// The subscriptions of the fully qualified `topic`: (`/namespace/node`, QoS).
    pub fn subscriptions(&self, topic: &str) -> Result<Vec<(String, QosProfile)>, String> {
        let ctopic = CString::new(topic).map_err(|e| e.to_string())?;
        // SAFETY: the info array is zero-initialized, filled by rcl and finalized here once.
        unsafe {
            let mut allocator = rcutils_get_default_allocator();
            let mut infos = rmw_get_zero_initialized_topic_endpoint_info_array();
            let ret = rcl_get_subscriptions_info_by_topic(
                self.node.as_ref(),
                &mut allocator,
                ctopic.as_ptr(),
                false,
                &mut infos,
            );
            check("rcl_get_subscriptions_info_by_topic", ret)?;
            let text = |p: *const std::os::raw::c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            let mut out = Vec::with_capacity(infos.size);
            if !infos.info_array.is_null() {
                for info in std::slice::from_raw_parts(infos.info_array, infos.size) {
                    let node = format!("{}/{}", text(info.node_namespace).trim_end_matches('/'), text(info.node_name));
                    out.push((node, QosProfile::from(info.qos_profile)));
                }
            }
            rmw_topic_endpoint_info_array_fini(&mut infos, &mut allocator);
            Ok(out)
        }
    }
}

impl Drop for GraphProbe {
    fn drop(&mut self) {
        // SAFETY: initialized in `new`, finalized once, in reverse order.
        unsafe {
            rcl_node_fini(self.node.as_mut());
            rcl_shutdown(self.context.as_mut());
            rcl_context_fini(self.context.as_mut());
            rcl_init_options_fini(self.init_options.as_mut());
        }
    }
}
