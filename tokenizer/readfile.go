package tokenizer

import (
	"fmt"
	"os"
)

// readFile is os.ReadFile for the files of a model folder, refusing what is
// not a regular file once links are followed (a named pipe would block the
// read until a writer comes, a device reads forever) with an error naming it.
func readFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	return os.ReadFile(path)
}
