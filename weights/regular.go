package weights

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// openRegular opens path for reading, refusing with ErrNotRegular anything
// that is not a regular file once links are followed: opening or reading a
// named pipe blocks until a writer comes, and a device reads as endless
// zeros or as nothing. The file is checked before it is opened (so that
// opening a pipe cannot block) and again after (it may have been replaced
// in between; openFlags makes that open return at once).
func openRegular(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	if err := checkRegular(path, st); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	if st, err = f.Stat(); err == nil {
		err = checkRegular(path, st)
	} else {
		err = &Error{File: path, Err: err}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// checkRegular returns an ErrNotRegular error naming path and saying what
// it is, unless st (of path, links followed) is a regular file.
func checkRegular(path string, st fs.FileInfo) error {
	m := st.Mode()
	if m.IsRegular() {
		return nil
	}
	what := "neither a regular file nor a folder"
	switch {
	case m.IsDir():
		what = "a folder"
	case m&fs.ModeNamedPipe != 0:
		what = "a named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		what = "a character device"
	case m&fs.ModeDevice != 0:
		what = "a block device"
	case m&fs.ModeSocket != 0:
		what = "a socket"
	}
	if target, err := filepath.EvalSymlinks(path); err == nil && target != path {
		what = fmt.Sprintf("a link to %s, %s", target, what)
	}
	return errf(path, "", ErrNotRegular, "%s", what)
}

// ReadFile reads the regular file path whole, as os.ReadFile does, but
// refuses a named pipe, a device or anything else that is not a regular file
// (links followed) with ErrNotRegular instead of blocking or reading forever:
// for the small files beside a checkpoint (config.json and its kin).
func ReadFile(path string) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	return data, nil
}
