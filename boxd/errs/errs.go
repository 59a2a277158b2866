// Package errs is boxd's one table of error types (PROTOCOL.md, "Errors") and the one place
// that maps operating-system errors onto them. Packages return *Error; the server writes it as
// {"error": {"type", "message"}} with its status. Messages are safe to show to the API caller.
package errs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"syscall"
)

// Error is an answer other than success, with the HTTP status it maps to.
type Error struct {
	Status  int
	Type    string
	Message string
}

func (e *Error) Error() string { return e.Message }

var types = map[int]string{
	http.StatusBadRequest:            "invalid_request",
	http.StatusUnauthorized:          "unauthorized",
	http.StatusForbidden:             "forbidden",
	http.StatusNotFound:              "not_found",
	http.StatusConflict:              "conflict",
	http.StatusRequestEntityTooLarge: "payload_too_large",
	http.StatusTooManyRequests:       "rate_limited",
	http.StatusInternalServerError:   "internal_error",
	http.StatusBadGateway:            "bad_gateway", // the ports route: nothing listens, or the app broke off
}

// New returns an error with the given status (one of the table's) and message.
func New(status int, format string, args ...any) *Error {
	t, ok := types[status]
	if !ok {
		status, t = http.StatusInternalServerError, types[http.StatusInternalServerError]
	}
	return &Error{Status: status, Type: t, Message: fmt.Sprintf(format, args...)}
}

func Invalid(format string, args ...any) *Error  { return New(http.StatusBadRequest, format, args...) }
func NotFound(format string, args ...any) *Error { return New(http.StatusNotFound, format, args...) }
func Conflict(format string, args ...any) *Error { return New(http.StatusConflict, format, args...) }
func TooLarge(format string, args ...any) *Error {
	return New(http.StatusRequestEntityTooLarge, format, args...)
}
func TooMany(format string, args ...any) *Error {
	return New(http.StatusTooManyRequests, format, args...)
}
func Internal(format string, args ...any) *Error {
	return New(http.StatusInternalServerError, format, args...)
}

// As returns err as an *Error; anything else becomes an internal error carrying its text.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return Internal("%v", err)
}

// FromOS maps a file-system error for path onto the table (missing 404, permission 403, ...).
// An error that already is an *Error is returned unchanged.
func FromOS(path string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			errno = syscall.ENOENT
		case errors.Is(err, fs.ErrPermission):
			errno = syscall.EACCES
		default:
			return Internal("%s: %v", path, err)
		}
	}
	msg := fmt.Sprintf("%s: %s", path, errno.Error())
	switch errno {
	case syscall.ENOENT:
		return NotFound("%s", msg)
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return New(http.StatusForbidden, "%s", msg)
	case syscall.ENOTEMPTY, syscall.EEXIST, syscall.EBUSY:
		return Conflict("%s", msg)
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		return TooLarge("%s", msg)
	case syscall.EISDIR, syscall.ENOTDIR, syscall.ELOOP, syscall.ENAMETOOLONG, syscall.EINVAL,
		syscall.ENXIO, syscall.ENODEV, syscall.EXDEV:
		return Invalid("%s", msg)
	}
	return Internal("%s", msg)
}
