module github.com/manifoldlm/manifold/bench/gomlx

go 1.26.8

replace github.com/manifoldlm/manifold => ../..

require (
	github.com/gomlx/gomlx v0.26.0
	github.com/manifoldlm/manifold v0.0.0-00010101000000-000000000000
)

require (
	github.com/dlclark/regexp2 v1.12.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	golang.org/x/exp v0.0.0-20250819193227-8b4c13bb791b // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
)
