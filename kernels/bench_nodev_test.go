//go:build !manifold_dev

package kernels

import "github.com/manifoldlm/manifold/backend"

// The production build has no experiments to benchmark (bench_dev_test.go).

func resetGEMVDev(*Backend) {}

func gemvDevVariants(*Backend, int, *backend.HostWeight, *backend.HostWeight) []gemvVariant {
	return nil
}
