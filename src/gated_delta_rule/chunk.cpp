// placeholder: implemented by the gated_delta_rule work
