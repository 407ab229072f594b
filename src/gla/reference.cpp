// placeholder: implemented by the gla work
