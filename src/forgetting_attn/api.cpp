// placeholder: implemented by the forgetting_attn work
