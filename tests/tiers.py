"""Which tests are `slow` (tests/README.md; read by tests/conftest.py).

Entries are a test file (every test in it) or ``file::test_function`` (every
parametrization). Measured with ``nice python -m pytest tests --durations=0 -q``
on the shared 2-core machine (about 13 runnable processes, so several times
slower than alone): every test function whose parametrizations together took
more than 0.5 s. Tests not listed, and not `subprocess`, are `fast`.
"""

SLOW = {
    # 2026-12-08 at load 15: 10 fresh interpreters exiting with daemon threads, 1-3 min
    "test_process_lifecycle.py::test_exit_with_daemon_threads_inside_ops_never_segfaults",
    # 2026-12-07 at load 30: 2-8 s each (every case runs 4 dtypes, modes and output masks)
    "test_shape_rules.py::test_forward_geometry_values_and_running_stats",  # 36 tests
    "test_shape_rules.py::test_backward_geometry_and_values",  # 54 tests
    "test_acceptance.py::test_br36_unflushed_graph_stays_bounded",  # 1.0 s, 1 test
    "test_llama_step.py",  # imports transformers: 5-25 s on the loaded machine, 1 test
    "test_random_aliasing.py",  # 80 random programs: 8 s on the loaded machine, 1 test
    "test_random_fused.py::test_random_fused_programs_match_cpu_long",  # 300 random programs: about 2 min
    "test_writes_through_views.py::test_write_through_view",  # 12.9 s, 374 tests
    "test_division_modes.py::test_division_modes_float_and_int",  # 3.9 s, 1 test
    "test_queue_growth.py::test_long_loop_mixed_ops_no_reads",  # 1.0 s, 1 test
    "test_host_device_copies.py::test_h2d_d2h_round_trip",  # 0.9 s, 110 tests
    "test_low_precision_reductions.py::test_lowp_reductions_of_random_data",  # 0.8 s, 2 tests
    "test_queue_growth.py::test_long_chain_of_views_no_reads",  # 0.8 s, 1 test
    "test_writes_through_views.py::test_read_through_view_after_base_write",  # 0.7 s, 34 tests
    "test_queue_growth.py::test_queue_autoflushes_without_reads",  # 0.6 s, 1 test
    "test_low_precision_reductions.py::test_lowp_softmax_uniform_exact",  # 0.5 s, 2 tests
    "test_autograd.py::test_column_select_in_loss",  # 7.5 s, 1 test
    "test_autograd.py::test_mlp_sgd_steps_match_cpu",  # 4.8 s, 1 test
    "test_autograd.py::test_cnn_forward_backward_matches_cpu",  # 2.5 s, 1 test
    "test_autograd.py::test_recurrent_layers_match_cpu",  # 1.6 s, 4 tests
    "test_autograd.py::test_softmax_layer_norm_cross_entropy",  # 0.9 s, 1 test
    "test_benchmarks_smoke.py::test_quick_run_completes_and_checks_pass",  # 197.5 s, 1 test
    # builds (first run, ~1 min on the loaded machine; then cached) and loads a C++ extension:
    "test_custom_ops.py::test_cpp_kernel_is_recorded_and_runs_at_flush",
    "test_custom_ops.py::test_cpp_mutating_kernel_seen_by_later_reads",
    "test_custom_ops.py::test_cpp_kernel_without_fake_runs_at_the_call",
    "test_custom_ops.py::test_cpp_kernel_error_surfaces_with_its_type_and_op",
    "test_custom_ops.py::test_cpp_kernels_adopted_once",
    "test_custom_ops.py::test_cpp_kernel_under_torch_compile",
    "test_op_table.py::test_table_is_generated_from_the_lists",  # 1.6 s, 1 test
    "test_meta_cache.py::test_interned_meta_keys_stay_bounded_under_a_shape_storm",  # 1.6 s, 1 test
    "test_call_time_errors.py::test_float_random_factories_reject_integer_dtypes",  # 1.5 s, 4 tests
    "test_call_time_errors.py::test_inplace_broadcast_to_larger_shape",  # 0.7 s, 46 tests
    "test_channels_last.py::test_channels_last_input_matches_cpu",  # 8.7 s, 74 tests
    "test_output_strides.py::test_fresh_result_strides",  # 12 s, 980 tests
    "test_device_api.py::test_torch_compile_runs_tpu_graphs_on_the_device",  # 8.2 s, 1 test
    "test_df16.py::test_edge_values",  # 0.7 s, 4 tests
    "test_dynamic_shapes.py::test_growing_size_compiles_log2_times_per_region_kind",  # 1.8 s, 1 test
    "test_examples.py::test_train_char_lm_quick_matches_cpu",  # 88.5 s, 1 test
    "test_examples.py::test_train_digits_quick_matches_cpu",  # 37.4 s, 1 test
    "test_fused_broadcast.py::test_scale_masked_fill_softmax_is_one_loop",  # 0.6 s, 4 tests
    "test_fused_layer_norm.py::test_layer_norm_outputs_equal_cpu",  # 1.8 s, 180 tests
    "test_fused_logsumexp.py::test_producers_and_logsumexp_match_cpu_exactly",  # 2.2 s, 42 tests
    "test_fused_logsumexp.py::test_other_cases_fall_back_and_match_cpu",  # 0.8 s, 7 tests
    "test_fused_logsumexp.py::test_the_fused_row_loop_runs_no_aten_op_and_materializes_no_producer",  # 0.7 s, 1 test
    "test_fused_logsumexp.py::test_rows_sprinkled_with_special_values_match_cpu",  # 0.6 s, 1 test
    "test_fused_math.py::test_sleef_mode_exp_within_one_ulp_of_cpu",  # 0.7 s, 1 test
    "test_host_share.py::test_random_reads_and_writes_match_cpu",  # 0.9 s, 1 test
    "test_intra_op_threads.py::test_softmax_rows_match_cpu_exactly",  # 1.2 s, 6 tests
    "test_intra_op_threads.py::test_elementwise_chain_matches_cpu_exactly",  # 0.6 s, 2 tests
    "test_model_kernels.py::test_transformer_encoder_layer_fast_path",  # 2.3 s, 24 tests
    "test_model_kernels.py::test_weight_norm_conv",  # 0.5 s, 10 tests
    "test_ops.py::test_op_matches_cpu",  # 149.6 s, 2206 tests
    "test_out_views.py::test_out_view_writes_where_cpu_writes",  # 1.3 s, 105 tests
    "test_out_views.py::test_strides_follow_every_input_permutation",  # 0.8 s, 12 tests
    "test_out_views.py::test_size1_dim_strides_after_flip_sort",  # 0.6 s, 27 tests
    "test_scalar_overflow.py::test_overflowing_scalar_raises_at_call_like_cpu",  # 2.3 s, 222 tests
    "test_scalar_overflow_float.py::test_scalar_into_a_float_result_behaves_like_cpu_at_the_call",  # 5.6 s, 1846 tests
    "test_spyre_schedule.py::test_tiles_fit_lx_and_cover_the_share",  # 1.0 s, 1 test
    "test_spyre_target.py::test_train_digits_quick_runs_on_spyre",  # 0.6 s, 1 test
    # measured 2026-12-05 on the loaded machine (--durations, branch spyre21):
    "test_spyre_exp_estimate.py::test_exp_estimate_within_one_step_everywhere",  # 2-4 min at load 18, 1 test
    "test_spyre_ring.py",  # 107 s with test_spyre_tiles.py, 77 tests; softmax 1000x300 8-14 s each
    "test_spyre_tiles.py::test_gathers_walk_tiles_with_per_tile_index_loads",  # 10.5 s, 3 tests
    # measured 2026-12-05 on the loaded machine (branch spyre21f):
    "test_spyre_ring_losses.py",  # 183 s, 102 tests; losses over up to 2000x300 and 1200x2000 inputs
    # measured 2026-12-06 (branch spyre22s, load ~23 with another test run beside it):
    "test_spyre_ring_renorm.py",  # 296 s, 83 tests; renorm, renorm_ and out= over up to 1000x300 inputs
    # measured 2026-12-07 (branch spyre22a, load ~15): every tail length of the chain pass's ops
    "test_spyre_chain_pass.py::test_unary_op_in_chain_every_tail",  # ~120 s, 15 tests
    "test_spyre_chain_pass.py::test_binary_op_in_chain_every_tail",  # ~60 s, 27 tests
    "test_spyre_chain_pass.py::test_every_op_in_chain_some_tails",  # 23-50 s, 3 tests
    "test_spyre_chain_pass.py::test_each_cpu_build_same_bits",  # 5-11 s, 3 tests
    "test_spyre_chain_pass.py::test_benchmark_chain_large_random",  # 1-5 s, 12 tests
    # measured 2026-12-07 (branch spyre23a, load ~15): an 11-op chain in each CPU build
    "test_spyre_chain_pass.py::test_long_chain_every_build_every_tail",  # 42-59 s, 3 tests
    "test_spyre_chain_pass.py::test_edge_values_every_build",  # ~28 s, 3 tests
    "test_spyre_row_pass.py::test_row_op_equals_cpu_every_shape",  # 4-11 s, 4 tests
    "test_spyre_row_pass.py::test_row_op_equals_cpu_every_width",  # 3-5 s, 3 tests
    "test_spyre_row_pass.py::test_each_cpu_build_same_bits",  # 2.8 s, 1 test
    "test_spyre_row_pass.py::test_layer_norm_statistics_stored",  # 2.6 s, 1 test
    "test_spyre_row_pass.py::test_benchmark_rows_take_the_pass",  # 1.9 s, 1 test
    # measured 2026-12-07 (branch spyre24b, load ~25): the 16-bit row pass and its conversions
    "test_spyre_row_pass.py::test_row_op16_every_width",  # 6-10 s, 6 tests
    "test_spyre_row_pass.py::test_row_op16_every_shape",  # 5-6 s, 8 tests
    "test_spyre_row_pass.py::test_layer_norm16_statistics_stored",  # ~3 s, 2 tests
    "test_spyre_row_pass.py::test_row_op16_non_contiguous_input",  # ~2 s, 2 tests
    "test_spyre_row_pass.py::test_each_cpu_build_same_bits16",  # ~3 s, 2 tests
    "test_spyre_convert16.py",  # 19 s, 6 tests
    "test_spyre_pool_tiles.py::test_pool_and_upsample_walk_tiles_with_one_rounding",  # ~14 s, 24 tests
    "test_spyre_pool_tiles.py::test_pool_gradients_round_once",  # ~6 s, 12 tests
    # measured 2026-12-07 (branch spyre22b, load ~15):
    "test_spyre_matmul16.py::test_mm_sums_each_dot_product_in_k_order",  # 3.7 s, 12 tests
    "test_spyre_matmul16.py::test_the_reference_tells_the_order",  # 1.0 s, 2 tests
    "test_spyre_reduce16.py::test_row_sums_every_width",  # 3.7 s, 2 tests
    "test_spyre_reduce16.py::test_ring_sum_and_mean_over_rows",  # 1.8 s, 12 tests
    "test_spyre_reduce16.py::test_baseline_build_same_bits",  # 1.2 s, 2 tests
    # measured 2026-12-07 23:40 (branch spyre24a, load ~33):
    "test_spyre_reduce16.py::test_f32_ring_sum_at_avx2",  # 83 s (a child process at AVX2), 1 test
    "test_spyre_reduce16.py::test_f16c_build_same_bits_as_avx2_and_baseline",  # 20 s, 1 test
    "test_spyre_reduce16.py::test_f32_ring_sum_in_cpu_order",  # 15 s, 12 tests
    "test_spyre_reduce16.py::test_f32_ring_sum_tile_path_and_strided_input",  # 3.1 s, 1 test
    # 2026-12-08 at load 11-16 (branch spyre25a)
    "test_spyre_reduce16.py::test_f32_row_sums_at_avx2",  # 24 s (a child process at AVX2), 1 test
    "test_spyre_reduce16.py::test_f32_row_sums_in_cpu_order",  # 7.5 s, 1 test
    "test_spyre_reduce16.py::test_f32_row_sums_ranks_and_strided_input",  # 1.1 s, 1 test
    "test_spyre_reduce16.py::test_f32_row_sums_baseline_build_same_bits",  # 0.9 s, 1 test
    "test_storage.py::test_alias_storage_keeps_exported_bytes_alive",  # 0.6 s, 1 test
    "test_sweep_scalar_conversions.py::test_sweep_tells_the_result_dtype_from_opmath",  # 5.9 s, 1 test
    "test_tpu_target.py::test_large_bf16_matmul_is_costed_near_peak",  # 1.7 s, 4 tests
    "test_tpu_target.py::test_roofline_example_runs",  # 1.0 s, 1 test
    "test_tpu_target.py::test_large_elementwise_region_is_costed_near_hbm_bandwidth",  # 0.7 s, 4 tests
    "test_tpu_tiling.py::test_huge_matmul_on_v4_rereads_and_its_memory_time_grows",  # 3.2 s, 1 test
    "test_tpu_tiling.py::test_vector_plans_fit_vmem_and_are_tile_aligned",  # 1.1 s, 1 test
    "test_tpu_tiling.py::test_large_vector_region_on_v4_is_blocked_and_fits",  # 1.0 s, 1 test
    "test_tpu_tiling.py::test_conv_transpose2d_forward_and_backward_are_costed_on_the_mxu",  # 1.0 s, 2 tests
    "test_tpu_tiling.py::test_profiler_table_shows_the_tiling",  # 0.6 s, 1 test
    "test_tpu_tiling.py::test_matmul_plans_fit_vmem_and_are_mxu_aligned",  # 0.5 s, 1 test
    "test_view_chain.py::test_apply_reads_what_as_strided_reads",  # 0.9 s, 1 test
    "test_view_chain.py::test_scatter_writes_what_as_strided_writes",  # 0.7 s, 1 test
    "test_views.py::test_random_view_programs_match_cpu",  # 1.0 s, 1 test
    "test_layer_norm_grouped_moments.py::test_avx2_rows_on_avx512_equal_cpu",  # 15 s at load 19, 24 tests (4 MB rows)
}
