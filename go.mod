module github.com/manifoldlm/manifold

go 1.26.8
