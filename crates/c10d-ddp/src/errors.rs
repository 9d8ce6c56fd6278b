//! The Reducer's error messages, worded after PyTorch's `reducer.cpp` where the situation is the
//! same (an autograd hook there is a `mark_variable_ready` call here).

use c10d_core::DistError;

/// Names a parameter by index, and by name when the Reducer was given names.
pub(crate) fn describe(index: usize, names: &[String]) -> String {
    match names.get(index) {
        Some(n) => format!("Parameter at index {index} with name {n}"),
        None => format!("Parameter at index {index}"),
    }
}

/// Any iteration call after an iteration failed (`first` is that failure; its kind is kept).
pub(crate) fn previous_pass_failed(first: &DistError) -> DistError {
    first.map_message(|m| {
        format!(
            "The previous backward pass of this Reducer failed, and reductions it launched may \
             still be using the buckets: build a new Reducer (and, after a communication error, \
             a new process group) before the next iteration. The first error was: {m}"
        )
    })
}

/// A gradient marked ready twice in one iteration.
pub(crate) fn marked_twice(index: usize, names: &[String]) -> DistError {
    DistError::invalid(format!(
        "Expected to mark a variable ready only once. {} has been marked as ready twice in this \
         iteration: mark_variable_ready was called twice for it (or it was declared unused and then \
         marked ready) before finalize_backward().",
        describe(index, names)
    ))
}

/// `finalize_backward` (or a new iteration) while some gradients were never marked ready.
pub(crate) fn unfinished(
    rank: usize,
    unmarked: &[usize],
    names: &[String],
    static_graph: bool,
) -> DistError {
    if static_graph {
        return DistError::invalid(format!(
            "Expected to have finished reduction in the prior iteration before starting a new one. \
             This error indicates that your training graph has changed in this iteration, e.g., one \
             parameter is used in first iteration, but then got unused in the second iteration. \
             this is not compatible with static_graph set to True.\nParameter indices which did \
             not receive grad for rank {rank}: {unmarked:?}"
        ));
    }
    let named: Vec<&str> = unmarked
        .iter()
        .filter_map(|&i| names.get(i).map(String::as_str))
        .collect();
    let named = if named.is_empty() {
        String::new()
    } else {
        format!(
            "\nParameters which did not receive grad for rank {rank}: {}",
            named.join(", ")
        )
    };
    DistError::invalid(format!(
        "Expected to have finished reduction in the prior iteration before starting a new one. \
         This error indicates that your module has parameters that were not used in producing \
         loss: their gradients were never marked ready. You can enable unused parameter \
         detection with `find_unused_parameters: true` in ReducerOptions, or mark every \
         parameter's gradient ready before finalize_backward().{named}\nParameter indices which \
         did not receive grad for rank {rank}: {unmarked:?}"
    ))
}

/// A parameter found unused in a static graph's first iteration was marked ready later.
pub(crate) fn static_graph_changed(index: usize, names: &[String]) -> DistError {
    DistError::invalid(format!(
        "Your training graph has changed in this iteration, e.g., one parameter is unused in \
         first iteration, but then got used in the second iteration. this is not compatible \
         with static_graph set to True. ({} was unused in the first iteration.)",
        describe(index, names)
    ))
}
