"""The MoE transformer: config, layers, attention, experts, decoder, decoding."""
