mod support;
