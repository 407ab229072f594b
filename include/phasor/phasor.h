// phasor core API: everything except the LibTorch layer (phasor/torch.h).
#pragma once

#include "phasor/common.h"
#include "phasor/device.h"
#include "phasor/emulator.h"
#include "phasor/favor.h"
#include "phasor/forgetting_attn.h"
#include "phasor/gated_delta_rule.h"
#include "phasor/gla.h"
#include "phasor/grape.h"
#include "phasor/rotary.h"
#include "phasor/short_conv.h"
#include "phasor/string_rotation.h"
#include "phasor/structured_rotation.h"
