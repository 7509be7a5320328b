"""onnx's own backend node tests, run through coacto.backend: a yardstick of operator coverage
that onnx maintains, not us.

Every node test the installed onnx package generates runs on the CPU (onnx builds them in memory:
nothing is downloaded). A test that fails today is an expected failure with its reason, strict:
one that starts passing fails the run until it is taken off the lists below. The lists are kept
by experiments/onnx_node_coverage.py (``--failures`` prints each failing test with its operator
and cause; the table is in README.md, "ONNX conformance").

Two lists: FAILING_OPERATORS, operators none of whose node tests pass, by the cause most of them
fail with; EXPECTED_FAILURES, single tests of operators that otherwise pass. onnx's model tests
(the "real" category, which downloads models, and the converted PyTorch modules) are not run
here: this module measures operators.
"""
from __future__ import annotations

import functools
import sys
import unittest
import warnings
from pathlib import Path

import numpy as np
import pytest

import coacto.backend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
import onnx_node_coverage as coverage  # noqa: E402

onnx_backend_test = pytest.importorskip("onnx.backend.test")

#: The causes, as experiments/onnx_node_coverage.py's FAILURE_GROUPS names them.
REASONS = {
    "operator not supported": "coacto lacks the operator (or its domain: ai.onnx.ml, training)",
    "operator supported on constants only": "coacto folds the operator on constants but cannot "
                                            "compute it on a model input",
    "operator form not supported": "coacto lacks this form of the operator (an attribute, axis, "
                                   "mode or extra output)",
    "non-float32 input": "an input of a type coacto does not carry (bfloat16, float8, float4, "
                         "int4, int2, uint64, string)",
    "non-float32 output": "an integer or bool output of values coacto cannot tell are whole, or "
                          "an output of a type coacto does not return (float8, int4, ...)",
    "rank above 8": "a tensor of rank above coacto.ir.MAX_RANK (8)",
    "empty tensor": "a tensor with a zero dimension: coacto computes on at least one element",
    "output does not depend on an input": "an output is a constant once the inputs coacto needs "
                                          "constant are folded",
    "sequence, map or optional values": "sequences, maps and optionals: coacto runs tensors only",
    "opset below 9": "the model declares opset 1; coacto reads opsets 9 and up",
    "wrong values": "coacto's result differs beyond the test's tolerance (an importer bug)",
}

FAILING_OPERATORS = {
    "operator not supported": """
        Acos Acosh Adagrad Adam AffineGrid ArgMax ArgMin ArrayFeatureExtractor Asin Asinh Atan Atanh
        Attention Bernoulli Binarizer BitCast BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor
        BlackmanWindow Col2Im Compress ConvInteger Cos Cosh CumProd CumSum DFT DeformConv
        DequantizeLinear Det DynamicQuantizeLinear Einsum EyeLike FlexAttention GRU GatherND
        GridSample HammingWindow HannWindow Hardmax If ImageDecoder InstanceNormalization IsInf LSTM
        LabelEncoder LinearAttention LpNormalization LpPool MatMulInteger MaxUnpool
        MeanVarianceNormalization MelWeightMatrix Mish Momentum NegativeLogLikelihoodLoss
        NonMaxSuppression NonZero OneHot QLinearConv QLinearMatMul QuantizeLinear RNN Range ReduceL1
        ReduceL2 ReduceLogSum ReduceLogSumExp RegexFullMatch RoiAlign STFT Scan Scatter
        ScatterElements ScatterND Shrink Sin Sinh SoftmaxCrossEntropyLoss StringConcat
        StringNormalizer StringSplit SwiGLU Swish Tan TensorScatter TfIdfVectorizer TopK
        TreeEnsemble Unique
    """.split(),
    "operator supported on constants only": """
        ConstantOfShape GatherElements Mod ReduceProd Trilu
    """.split(),
    "sequence, map or optional values": """
        Loop OptionalGetElement OptionalHasElement ReverseSequence SequenceInsert SequenceMap
        SplitToSequence
    """.split(),
    "non-float32 output": """
        Size
    """.split(),
    "opset below 9": """
        Not
    """.split(),
    "operator form not supported": """
        PRelu
    """.split(),
}
EXPECTED_FAILURES = {
    "operator not supported": """
        test_causal_conv_with_state_b1_c1_degenerate test_causal_conv_with_state_basic
        test_causal_conv_with_state_decode_step test_causal_conv_with_state_fp16
        test_causal_conv_with_state_kernel_size_one
        test_causal_conv_with_state_short_input_no_past_state
        test_causal_conv_with_state_silu test_causal_conv_with_state_silu_fp16
        test_causal_conv_with_state_silu_with_past_state
        test_causal_conv_with_state_swish_alias test_causal_conv_with_state_with_bias
        test_causal_conv_with_state_with_bias_and_past_state
        test_causal_conv_with_state_with_past_state test_center_crop_pad_crop
        test_center_crop_pad_crop_and_pad test_center_crop_pad_crop_axes_chw
        test_center_crop_pad_crop_axes_hwc test_center_crop_pad_crop_negative_axes_hwc
        test_center_crop_pad_pad test_group_normalization_epsilon
        test_group_normalization_example
        test_reduce_sum_square_default_axes_keepdims_example
        test_reduce_sum_square_default_axes_keepdims_random
        test_reduce_sum_square_do_not_keepdims_example
        test_reduce_sum_square_do_not_keepdims_random test_reduce_sum_square_empty_set
        test_reduce_sum_square_keepdims_example test_reduce_sum_square_keepdims_random
        test_reduce_sum_square_negative_axes_keepdims_example
        test_reduce_sum_square_negative_axes_keepdims_random test_rms_normalization_2d_axis0
        test_rms_normalization_2d_axis1 test_rms_normalization_2d_axis_negative_1
        test_rms_normalization_2d_axis_negative_2 test_rms_normalization_3d_axis0_epsilon
        test_rms_normalization_3d_axis1_epsilon test_rms_normalization_3d_axis2_epsilon
        test_rms_normalization_3d_axis_negative_1_epsilon
        test_rms_normalization_3d_axis_negative_2_epsilon
        test_rms_normalization_3d_axis_negative_3_epsilon test_rms_normalization_4d_axis0
        test_rms_normalization_4d_axis1 test_rms_normalization_4d_axis2
        test_rms_normalization_4d_axis3 test_rms_normalization_4d_axis_negative_1
        test_rms_normalization_4d_axis_negative_2 test_rms_normalization_4d_axis_negative_3
        test_rms_normalization_4d_axis_negative_4 test_rms_normalization_default_axis
        test_rotary_embedding test_rotary_embedding_3d_input
        test_rotary_embedding_interleaved test_rotary_embedding_no_position_ids
        test_rotary_embedding_no_position_ids_interleaved
        test_rotary_embedding_no_position_ids_rotary_dim
        test_rotary_embedding_with_interleaved_rotary_dim
        test_rotary_embedding_with_rotary_dim test_sce_NCd1_mean_weight_negative_ii_expanded
        test_sce_NCd1_mean_weight_negative_ii_log_prob_expanded
        test_sce_NCd1d2d3_none_no_weight_negative_ii_expanded
        test_sce_NCd1d2d3_none_no_weight_negative_ii_log_prob_expanded
        test_sce_NCd1d2d3_sum_weight_high_ii_expanded
        test_sce_NCd1d2d3_sum_weight_high_ii_log_prob_expanded
        test_sce_NCd1d2d3d4d5_mean_weight_expanded
        test_sce_NCd1d2d3d4d5_mean_weight_log_prob_expanded
        test_sce_NCd1d2d3d4d5_none_no_weight_expanded
        test_sce_NCd1d2d3d4d5_none_no_weight_log_prob_expanded test_sce_mean_3d_expanded
        test_sce_mean_3d_log_prob_expanded test_sce_mean_expanded
        test_sce_mean_log_prob_expanded test_sce_mean_no_weight_ii_3d_expanded
        test_sce_mean_no_weight_ii_3d_log_prob_expanded
        test_sce_mean_no_weight_ii_4d_expanded
        test_sce_mean_no_weight_ii_4d_log_prob_expanded test_sce_mean_no_weight_ii_expanded
        test_sce_mean_no_weight_ii_log_prob_expanded test_sce_mean_weight_expanded
        test_sce_mean_weight_ii_3d_expanded test_sce_mean_weight_ii_3d_log_prob_expanded
        test_sce_mean_weight_ii_4d_expanded test_sce_mean_weight_ii_4d_log_prob_expanded
        test_sce_mean_weight_ii_expanded test_sce_mean_weight_ii_log_prob_expanded
        test_sce_mean_weight_log_prob_expanded test_sce_none_expanded
        test_sce_none_log_prob_expanded test_sce_none_weights_expanded
        test_sce_none_weights_log_prob_expanded test_sce_sum_expanded
        test_sce_sum_log_prob_expanded
    """.split(),
    "operator supported on constants only": """
        test_nllloss_NC_expanded test_nllloss_NCd1_expanded test_nllloss_NCd1_ii_expanded
        test_nllloss_NCd1d2_expanded
        test_nllloss_NCd1d2_no_weight_reduction_mean_ii_expanded
        test_nllloss_NCd1d2_reduction_mean_expanded
        test_nllloss_NCd1d2_reduction_sum_expanded
        test_nllloss_NCd1d2d3_none_no_weight_negative_ii_expanded
        test_nllloss_NCd1d2d3d4d5_none_no_weight_expanded
    """.split(),
    "operator form not supported": """
        test_batchnorm_epsilon_training_mode test_batchnorm_example_training_mode
        test_convtranspose_1d test_convtranspose_3d test_convtranspose_autopad_same
        test_convtranspose_dilations test_convtranspose_group_2
        test_convtranspose_group_2_image_3 test_convtranspose_kernel_shape
        test_convtranspose_output_shape test_dropout_default_mask
        test_dropout_default_mask_ratio test_layer_normalization_2d_axis0
        test_layer_normalization_2d_axis1 test_layer_normalization_2d_axis_negative_1
        test_layer_normalization_2d_axis_negative_2
        test_layer_normalization_3d_axis0_epsilon test_layer_normalization_3d_axis1_epsilon
        test_layer_normalization_3d_axis2_epsilon
        test_layer_normalization_3d_axis_negative_1_epsilon
        test_layer_normalization_3d_axis_negative_2_epsilon
        test_layer_normalization_3d_axis_negative_3_epsilon
        test_layer_normalization_4d_axis0 test_layer_normalization_4d_axis1
        test_layer_normalization_4d_axis2 test_layer_normalization_4d_axis3
        test_layer_normalization_4d_axis_negative_1
        test_layer_normalization_4d_axis_negative_2
        test_layer_normalization_4d_axis_negative_3
        test_layer_normalization_4d_axis_negative_4 test_layer_normalization_default_axis
        test_maxpool_with_argmax_2d_precomputed_pads
        test_maxpool_with_argmax_2d_precomputed_strides test_reshape_allowzero_reordered
        test_resize_downsample_scales_cubic
        test_resize_downsample_scales_cubic_A_n0p5_exclude_outside
        test_resize_downsample_scales_cubic_align_corners
        test_resize_downsample_scales_cubic_antialias test_resize_downsample_scales_linear
        test_resize_downsample_scales_linear_align_corners
        test_resize_downsample_scales_linear_antialias
        test_resize_downsample_scales_linear_half_pixel_symmetric
        test_resize_downsample_sizes_cubic test_resize_downsample_sizes_cubic_antialias
        test_resize_downsample_sizes_linear_antialias
        test_resize_downsample_sizes_linear_pytorch_half_pixel
        test_resize_downsample_sizes_nearest_not_larger
        test_resize_downsample_sizes_nearest_not_smaller test_resize_tf_crop_and_resize
        test_resize_tf_crop_and_resize_axes_2_3 test_resize_tf_crop_and_resize_axes_3_2
        test_resize_tf_crop_and_resize_extrapolation_value test_resize_upsample_scales_cubic
        test_resize_upsample_scales_cubic_A_n0p5_exclude_outside
        test_resize_upsample_scales_cubic_align_corners
        test_resize_upsample_scales_cubic_asymmetric test_resize_upsample_scales_linear
        test_resize_upsample_scales_linear_align_corners
        test_resize_upsample_scales_linear_half_pixel_symmetric
        test_resize_upsample_sizes_cubic test_resize_upsample_sizes_nearest_not_larger
        test_resize_upsample_sizes_nearest_not_smaller test_split_zero_size_splits_opset13
        test_split_zero_size_splits_opset18 test_training_dropout
        test_training_dropout_default test_training_dropout_default_mask
        test_training_dropout_mask test_training_dropout_zero_ratio
        test_training_dropout_zero_ratio_mask
    """.split(),
    "non-float32 input": """
        test_add_uint64 test_cast_BFLOAT16_to_FLOAT test_cast_FLOAT4E2M1_to_FLOAT
        test_cast_FLOAT4E2M1_to_FLOAT16 test_cast_FLOAT8E4M3FNUZ_to_FLOAT
        test_cast_FLOAT8E4M3FNUZ_to_FLOAT16 test_cast_FLOAT8E4M3FN_to_FLOAT
        test_cast_FLOAT8E4M3FN_to_FLOAT16 test_cast_FLOAT8E5M2FNUZ_to_FLOAT
        test_cast_FLOAT8E5M2FNUZ_to_FLOAT16 test_cast_FLOAT8E5M2_to_FLOAT
        test_cast_FLOAT8E5M2_to_FLOAT16 test_cast_INT2_to_FLOAT test_cast_INT2_to_FLOAT16
        test_cast_INT2_to_INT8 test_cast_INT4_to_FLOAT test_cast_INT4_to_FLOAT16
        test_cast_INT4_to_INT8 test_cast_UINT2_to_FLOAT test_cast_UINT2_to_FLOAT16
        test_cast_UINT2_to_UINT8 test_cast_UINT4_to_FLOAT test_cast_UINT4_to_FLOAT16
        test_cast_UINT4_to_UINT8 test_cast_e8m0_FLOAT8E8M0_to_FLOAT
        test_cast_e8m0_FLOAT8E8M0_to_FLOAT16 test_castlike_BFLOAT16_to_FLOAT
        test_castlike_BFLOAT16_to_FLOAT_expanded test_castlike_FLOAT4E2M1_to_FLOAT
        test_castlike_FLOAT4E2M1_to_FLOAT16 test_castlike_FLOAT4E2M1_to_FLOAT16_expanded
        test_castlike_FLOAT4E2M1_to_FLOAT_expanded test_castlike_FLOAT8E4M3FNUZ_to_FLOAT
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded test_castlike_FLOAT8E4M3FN_to_FLOAT
        test_castlike_FLOAT8E4M3FN_to_FLOAT16 test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded
        test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded test_castlike_FLOAT8E5M2FNUZ_to_FLOAT
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded test_castlike_FLOAT8E5M2_to_FLOAT
        test_castlike_FLOAT8E5M2_to_FLOAT16 test_castlike_FLOAT8E5M2_to_FLOAT16_expanded
        test_castlike_FLOAT8E5M2_to_FLOAT_expanded test_castlike_INT2_to_FLOAT
        test_castlike_INT2_to_FLOAT16 test_castlike_INT2_to_FLOAT16_expanded
        test_castlike_INT2_to_FLOAT_expanded test_castlike_INT2_to_INT8
        test_castlike_INT2_to_INT8_expanded test_castlike_INT4_to_FLOAT
        test_castlike_INT4_to_FLOAT16 test_castlike_INT4_to_FLOAT16_expanded
        test_castlike_INT4_to_FLOAT_expanded test_castlike_INT4_to_INT8
        test_castlike_INT4_to_INT8_expanded test_castlike_UINT2_to_FLOAT
        test_castlike_UINT2_to_FLOAT16 test_castlike_UINT2_to_FLOAT16_expanded
        test_castlike_UINT2_to_FLOAT_expanded test_castlike_UINT2_to_UINT8
        test_castlike_UINT2_to_UINT8_expanded test_castlike_UINT4_to_FLOAT
        test_castlike_UINT4_to_FLOAT16 test_castlike_UINT4_to_FLOAT16_expanded
        test_castlike_UINT4_to_FLOAT_expanded test_castlike_UINT4_to_UINT8
        test_castlike_UINT4_to_UINT8_expanded test_celu_bfloat16 test_celu_bfloat16_expanded
        test_div_uint64 test_equal_string test_equal_string_broadcast test_equal_uint64
        test_greater_equal_uint64 test_greater_equal_uint64_expanded test_greater_uint64
        test_less_equal_uint64 test_less_equal_uint64_expanded test_less_uint64
        test_max_uint64 test_min_uint64 test_mul_uint64 test_sub_uint64
    """.split(),
    "non-float32 output": """
        test_add_int16 test_add_int8 test_add_uint16 test_add_uint32 test_add_uint8
        test_cast_FLOAT16_to_FLOAT4E2M1 test_cast_FLOAT16_to_FLOAT8E4M3FN
        test_cast_FLOAT16_to_FLOAT8E4M3FNUZ test_cast_FLOAT16_to_FLOAT8E5M2
        test_cast_FLOAT16_to_FLOAT8E5M2FNUZ test_cast_FLOAT16_to_INT2
        test_cast_FLOAT16_to_INT4 test_cast_FLOAT16_to_UINT2 test_cast_FLOAT16_to_UINT4
        test_cast_FLOAT_to_BFLOAT16 test_cast_FLOAT_to_FLOAT4E2M1
        test_cast_FLOAT_to_FLOAT8E4M3FN test_cast_FLOAT_to_FLOAT8E4M3FNUZ
        test_cast_FLOAT_to_FLOAT8E5M2 test_cast_FLOAT_to_FLOAT8E5M2FNUZ
        test_cast_FLOAT_to_INT2 test_cast_FLOAT_to_INT4 test_cast_FLOAT_to_UINT2
        test_cast_FLOAT_to_UINT4 test_cast_e8m0_FLOAT16_to_FLOAT8E8M0
        test_cast_e8m0_FLOAT_to_FLOAT8E8M0 test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN
        test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ
        test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2
        test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ
        test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN
        test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ
        test_cast_no_saturate_FLOAT_to_FLOAT8E5M2
        test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ test_castlike_FLOAT16_to_FLOAT4E2M1
        test_castlike_FLOAT16_to_FLOAT4E2M1_expanded test_castlike_FLOAT16_to_FLOAT8E4M3FN
        test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ
        test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded test_castlike_FLOAT16_to_FLOAT8E5M2
        test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ
        test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_FLOAT16_to_FLOAT8E5M2_expanded test_castlike_FLOAT16_to_INT2
        test_castlike_FLOAT16_to_INT2_expanded test_castlike_FLOAT16_to_INT4
        test_castlike_FLOAT16_to_INT4_expanded test_castlike_FLOAT16_to_UINT2
        test_castlike_FLOAT16_to_UINT2_expanded test_castlike_FLOAT16_to_UINT4
        test_castlike_FLOAT16_to_UINT4_expanded test_castlike_FLOAT_to_BFLOAT16
        test_castlike_FLOAT_to_BFLOAT16_expanded test_castlike_FLOAT_to_FLOAT4E2M1
        test_castlike_FLOAT_to_FLOAT4E2M1_expanded test_castlike_FLOAT_to_FLOAT8E4M3FN
        test_castlike_FLOAT_to_FLOAT8E4M3FNUZ test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded test_castlike_FLOAT_to_FLOAT8E5M2
        test_castlike_FLOAT_to_FLOAT8E5M2FNUZ test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_FLOAT_to_FLOAT8E5M2_expanded test_castlike_FLOAT_to_INT2
        test_castlike_FLOAT_to_INT2_expanded test_castlike_FLOAT_to_INT4
        test_castlike_FLOAT_to_INT4_expanded test_castlike_FLOAT_to_UINT2
        test_castlike_FLOAT_to_UINT2_expanded test_castlike_FLOAT_to_UINT4
        test_castlike_FLOAT_to_UINT4_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2_expanded
        test_clip_default_int8_inbounds test_clip_default_int8_max
        test_clip_default_int8_min test_div_int16 test_div_int32_trunc test_div_int8
        test_div_uint16 test_div_uint32 test_div_uint8 test_max_int16 test_max_int32
        test_max_int64 test_max_int8 test_max_uint16 test_max_uint32 test_max_uint8
        test_maxpool_2d_uint8 test_min_int16 test_min_int32 test_min_int64 test_min_int8
        test_min_uint16 test_min_uint32 test_min_uint8 test_mul_int16 test_mul_int8
        test_mul_uint16 test_mul_uint32 test_mul_uint8 test_pow_types_int32_float32
        test_pow_types_int32_int32 test_pow_types_int64_float32 test_pow_types_int64_int64
        test_reduce_max_bool_inputs test_reduce_min_bool_inputs test_shape
        test_shape_clip_end test_shape_clip_start test_shape_end_1 test_shape_end_negative_1
        test_shape_example test_shape_start_1 test_shape_start_1_end_2
        test_shape_start_1_end_negative_1 test_shape_start_greater_than_end
        test_shape_start_negative_1 test_sub_int16 test_sub_int8 test_sub_uint16
        test_sub_uint32 test_sub_uint8
    """.split(),
    "empty tensor": """
        test_causal_conv_with_state_kernel_size_one_expanded test_slice_start_out_of_bounds
    """.split(),
    "output does not depend on an input": """
        test_constant test_reduce_max_empty_set test_reduce_max_empty_set_bool
        test_reduce_min_empty_set test_reduce_sum_empty_set
        test_reduce_sum_empty_set_non_reduced_axis_zero
        test_reduce_sum_square_empty_set_expanded
    """.split(),
    "sequence, map or optional values": """
        test_identity_opt test_identity_sequence
    """.split(),
    "wrong values": """
        test_mish_expanded
    """.split(),
}

#: Tests that pass although their operator is listed as failing: the expanded forms, written
#: with operators coacto has (CastLike among them), of operators it has not.
PASSING_DESPITE_OPERATOR = set("""
        test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded
        test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded
        test_attention_24_fullymasked_qk_matmul_output_mode3_zero_expanded
        test_attention_24_qk_matmul_output_mode3_softmax_precision_expanded
        test_attention_3d_attn_mask_expanded test_attention_3d_causal_expanded
        test_attention_3d_diff_heads_sizes_attn_mask_expanded
        test_attention_3d_diff_heads_sizes_causal_expanded
        test_attention_3d_diff_heads_sizes_expanded
        test_attention_3d_diff_heads_sizes_scaled_expanded
        test_attention_3d_diff_heads_sizes_softcap_expanded
        test_attention_3d_diff_heads_with_past_and_present_expanded
        test_attention_3d_expanded test_attention_3d_gqa_attn_mask_expanded
        test_attention_3d_gqa_causal_expanded test_attention_3d_gqa_expanded
        test_attention_3d_gqa_scaled_expanded test_attention_3d_gqa_softcap_expanded
        test_attention_3d_gqa_with_past_and_present_expanded
        test_attention_3d_local_window_expanded test_attention_3d_scaled_expanded
        test_attention_3d_softcap_expanded test_attention_3d_transpose_verification_expanded
        test_attention_3d_with_past_and_present_expanded
        test_attention_3d_with_past_and_present_qk_matmul_bias_expanded
        test_attention_3d_with_past_and_present_qk_matmul_expanded
        test_attention_3d_with_past_and_present_qk_matmul_softcap_expanded
        test_attention_3d_with_past_and_present_qk_matmul_softmax_expanded
        test_attention_4d_attn_mask_3d_causal_expanded
        test_attention_4d_attn_mask_3d_expanded
        test_attention_4d_attn_mask_4d_causal_expanded
        test_attention_4d_attn_mask_4d_expanded test_attention_4d_attn_mask_bool_4d_expanded
        test_attention_4d_attn_mask_bool_expanded test_attention_4d_attn_mask_expanded
        test_attention_4d_causal_expanded test_attention_4d_causal_fp16_expanded
        test_attention_4d_causal_nonpad_attn_mask_composition_expanded
        test_attention_4d_causal_nonpad_batch_prefill_expanded
        test_attention_4d_causal_nonpad_continued_prefill_expanded
        test_attention_4d_causal_nonpad_negative_offset_structural_empty_expanded
        test_attention_4d_causal_with_past_and_present_expanded
        test_attention_4d_diff_heads_mask4d_padded_kv_expanded
        test_attention_4d_diff_heads_sizes_attn_mask_expanded
        test_attention_4d_diff_heads_sizes_causal_expanded
        test_attention_4d_diff_heads_sizes_expanded
        test_attention_4d_diff_heads_sizes_scaled_expanded
        test_attention_4d_diff_heads_sizes_softcap_expanded
        test_attention_4d_diff_heads_with_past_and_present_expanded
        test_attention_4d_diff_heads_with_past_and_present_mask3d_expanded
        test_attention_4d_diff_heads_with_past_and_present_mask4d_expanded
        test_attention_4d_expanded test_attention_4d_fp16_expanded
        test_attention_4d_gqa_attn_mask_expanded test_attention_4d_gqa_causal_expanded
        test_attention_4d_gqa_causal_nonpad_decode_expanded
        test_attention_4d_gqa_causal_nonpad_decode_fp16_expanded
        test_attention_4d_gqa_expanded test_attention_4d_gqa_scaled_expanded
        test_attention_4d_gqa_softcap_expanded
        test_attention_4d_gqa_with_past_and_present_expanded
        test_attention_4d_gqa_with_past_and_present_fp16_expanded
        test_attention_4d_scaled_expanded test_attention_4d_softcap_expanded
        test_attention_4d_softcap_neginf_mask_expanded
        test_attention_4d_softcap_neginf_mask_poison_expanded
        test_attention_4d_with_past_and_present_expanded
        test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal_expanded
        test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_expanded
        test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal_expanded
        test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_expanded
        test_attention_4d_with_past_and_present_qk_matmul_bias_expanded
        test_attention_4d_with_past_and_present_qk_matmul_expanded
        test_attention_4d_with_qk_matmul_bias_expanded
        test_attention_4d_with_qk_matmul_expanded
        test_attention_4d_with_qk_matmul_softcap_expanded
        test_attention_4d_with_qk_matmul_softmax_expanded
        test_attention_bidirectional_window_expanded
        test_attention_causal_boolmask_nan_robustness_expanded
        test_attention_local_window_default_expanded test_attention_local_window_expanded
        test_attention_local_window_ext_cache_float16_mask_expanded
        test_attention_local_window_ext_cache_rank2_mask_expanded
        test_attention_local_window_ext_cache_rank3_head_mask_expanded
        test_attention_local_window_ext_cache_rank4_batch_mask_expanded
        test_attention_local_window_gqa_rank4_mask_expanded
        test_attention_local_window_rank1_boolean_mask_expanded
        test_attention_local_window_with_past_expanded test_prelu_broadcast_expanded
        test_prelu_example_expanded test_reduce_l1_default_axes_keepdims_example_expanded
        test_reduce_l1_default_axes_keepdims_random_expanded
        test_reduce_l1_do_not_keepdims_example_expanded
        test_reduce_l1_do_not_keepdims_random_expanded
        test_reduce_l1_keep_dims_example_expanded test_reduce_l1_keep_dims_random_expanded
        test_reduce_l1_negative_axes_keep_dims_example_expanded
        test_reduce_l1_negative_axes_keep_dims_random_expanded
        test_reduce_l2_default_axes_keepdims_example_expanded
        test_reduce_l2_default_axes_keepdims_random_expanded
        test_reduce_l2_do_not_keepdims_example_expanded
        test_reduce_l2_do_not_keepdims_random_expanded
        test_reduce_l2_keep_dims_example_expanded test_reduce_l2_keep_dims_random_expanded
        test_reduce_l2_negative_axes_keep_dims_example_expanded
        test_reduce_l2_negative_axes_keep_dims_random_expanded
        test_reduce_log_sum_asc_axes_expanded test_reduce_log_sum_default_expanded
        test_reduce_log_sum_desc_axes_expanded
        test_reduce_log_sum_exp_default_axes_keepdims_example_expanded
        test_reduce_log_sum_exp_default_axes_keepdims_random_expanded
        test_reduce_log_sum_exp_do_not_keepdims_example_expanded
        test_reduce_log_sum_exp_do_not_keepdims_random_expanded
        test_reduce_log_sum_exp_keepdims_example_expanded
        test_reduce_log_sum_exp_keepdims_random_expanded
        test_reduce_log_sum_exp_negative_axes_keepdims_example_expanded
        test_reduce_log_sum_exp_negative_axes_keepdims_random_expanded
        test_reduce_log_sum_negative_axes_expanded test_shrink_hard_expanded_ver18
        test_shrink_soft_expanded_ver18 test_swish_expanded
""".split())


def _expected_failures() -> tuple[dict[str, str], dict[str, str]]:
    """({operator: reason}, {test name: reason}) from the two lists."""
    out = {}
    for group, ops in FAILING_OPERATORS.items():
        for op in ops:
            out[op] = f"{op}: {REASONS[group]}"
    by_test = {}
    for group, tests in EXPECTED_FAILURES.items():
        for t in tests:
            by_test[t] = REASONS[group]
    return out, by_test


class NodeTestFailed(Exception):
    """An expected failure, re-raised without its traceback: pytest would otherwise spend most
    of the run drawing a thousand tracebacks through onnx's runner (parsing its source, printing
    every argument array) for tests whose cause the reason already states."""


def _quiet(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        except unittest.SkipTest:
            raise
        except Exception as e:  # noqa: BLE001 - every failure of an expected failure is one
            raise NodeTestFailed(f"{type(e).__name__}: {e}") from None
    return run


def _node_tests() -> type:
    with warnings.catch_warnings():  # onnx's generators overflow casts on purpose
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            runner = onnx_backend_test.BackendTest(coacto.backend, __name__)
            cases = coverage.load_cases()  # the same TestCase objects, for their operators
    tests = runner.test_cases["OnnxBackendNodeModelTest"]
    schemas = coverage.schema_names()
    op_of = {c.name: coverage.operator_of(c, schemas) for c in cases}
    by_op, by_test = _expected_failures()
    for name in [n for n in vars(tests) if n.startswith("test_")]:
        if not name.endswith("_cpu"):  # coacto runs on the CPU: onnx's runner would skip them
            delattr(tests, name)
            continue
        case = name[: -len("_cpu")]
        reason = by_test.get(case) or (None if case in PASSING_DESPITE_OPERATOR
                                       else by_op.get(op_of[case]))
        if reason:
            mark = pytest.mark.xfail(strict=True, reason=reason)
            setattr(tests, name, mark(_quiet(getattr(tests, name))))
    return tests


OnnxBackendNodeModelTest = _node_tests()


def test_the_lists_name_only_existing_tests_and_operators():
    cases = coverage.load_cases()
    names = {c.name for c in cases}
    schemas = coverage.schema_names()
    ops = {coverage.operator_of(c, schemas) for c in cases}
    listed_tests = {t for ts in EXPECTED_FAILURES.values() for t in ts}
    listed_ops = {o for os_ in FAILING_OPERATORS.values() for o in os_}
    assert listed_tests <= names, sorted(listed_tests - names)
    assert listed_ops <= ops, sorted(listed_ops - ops)
    assert set(FAILING_OPERATORS) | set(EXPECTED_FAILURES) <= set(REASONS)


# -- the backend itself

def _reshape_model():
    from onnx import TensorProto, helper

    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph(
        [node], "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                            helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_inputs_coacto_needs_constant_are_folded_and_cached_by_value():
    rep = coacto.backend.prepare(_reshape_model())
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    y, = rep.run([x, np.array([3, 4], dtype=np.int64)])
    assert rep.folded == ("shape",)
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    y, = rep.run({"x": x, "shape": np.array([4, 3], dtype=np.int64)})  # other values: recompiled
    np.testing.assert_array_equal(y, x.reshape(4, 3))
    rep.run([x, np.array([3, 4], dtype=np.int64)])
    assert len(rep._runtimes) == 2


def test_refusals_are_coacto_errors_that_say_what_was_folded():
    from onnx import TensorProto, helper

    node = helper.make_node("Cos", ["x"], ["y"])
    graph = helper.make_graph([node], "cos",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(coacto.UnsupportedOperatorError, match="Cos"):
        coacto.backend.run_model(model, [np.ones(3, np.float32)])
    with pytest.raises(coacto.InputError, match="sequences"):
        coacto.backend.run_model(model, [[np.ones(3, np.float32)]])
    with pytest.raises(coacto.InputError, match="takes 1 input"):
        coacto.backend.run_model(model, [np.ones(3, np.float32)] * 2)


def test_run_node_and_devices():
    from onnx import helper

    x = np.array([[-1.0, 2.0]], dtype=np.float32)
    y, = coacto.backend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])
    np.testing.assert_array_equal(y, [[0.0, 2.0]])
    assert coacto.backend.supports_device("CPU")
    assert not coacto.backend.supports_device("CUDA")
    assert not coacto.backend.supports_device("TPU")
    with pytest.raises(coacto.CoactoError, match="CPU"):
        coacto.backend.prepare(_reshape_model(), "CUDA")
